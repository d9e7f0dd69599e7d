import pytest
from pydantic import ValidationError

from protocol.config import ModelSpec, RunConfig


def _cfg(**kw):
    base = dict(
        model=ModelSpec(factory="trainer.model:small_gpt", config={"n_layer": 2}),
        dataset_manifest_hash="0" * 64,
        initial_model_hash="1" * 64,
    )
    return RunConfig(**(base | kw))


def test_config_hash_is_stable_and_sensitive():
    a, b = _cfg(), _cfg()
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() != _cfg(inner_steps=100).config_hash()


@pytest.mark.parametrize(
    "kw",
    [
        {"inner_steps": 12, "segment_len": 5},
        {"sampled_segments": 101},  # H/k = 100 at the defaults
        {"replay_mode": "tolerance", "tolerance": 0.0},
        {"dataset_manifest_hash": "XYZ"},
        {"unknown_field": 1},
    ],
)
def test_bad_configs_are_refused(kw):
    with pytest.raises(ValidationError):
        _cfg(**kw)


def test_model_spec_factory_format():
    with pytest.raises(ValidationError):
        ModelSpec(factory="os.system")
