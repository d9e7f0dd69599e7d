import json

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


def test_tolerance_mode_samples_windows():
    """Issue 36: under sampling segments the summed residuals leave 13× (s = 3) to 20× (s = 2) the
    honest noise of steering (RESULTS §5c), under windows 9.2×: a tolerance run samples windows."""
    tol = {"replay_mode": "tolerance", "tolerance": 0.1, "tolerance_exp_avg": 0.1,
           "tolerance_exp_avg_sq": 0.1, "inner": {"moments": "fp32"}}  # fmt: skip
    assert _cfg(**tol).windowed
    for s in (2, 3):
        with pytest.raises(ValidationError, match="needs sampling 'windows'"):
            _cfg(**tol, sampling="segments", sampled_segments=s)
    assert not _cfg(sampling="segments").windowed  # bitwise runs may still sample segments


def test_a_run_config_with_the_removed_delayed_schedule_is_refused():
    """Issue 22: a run config JSON naming `overlap = "delayed"` fails on that field alone, with
    the allowed values; `none` and `eager` keep their wire spellings (and hashes)."""
    data = _cfg(overlap="eager").model_dump(mode="json")
    assert data["overlap"] == "eager"
    with pytest.raises(ValidationError) as e:
        RunConfig.model_validate_json(json.dumps({**data, "overlap": "delayed"}))
    assert [(err["loc"], err["msg"]) for err in e.value.errors()] == [
        (("overlap",), "Input should be 'none' or 'eager'")
    ]
    assert "overlap" not in _cfg(overlap="none").model_dump()  # none: the field-less config's hash
    assert _cfg(overlap="none").config_hash() == _cfg().config_hash()


def test_model_spec_factory_format():
    with pytest.raises(ValidationError):
        ModelSpec(factory="os.system")
