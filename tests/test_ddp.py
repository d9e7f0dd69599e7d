"""Two gloo ranks train one host's outer step; its sampled segment replays bitwise in one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nodekit.statestore import StateStore
from replay.step import (
    TrainJob,
    configure_determinism,
    load_training_state,
    train_segment,
    training_hash,
    training_state,
)
from tests.support.replay import HOST, ROOT, fresh, tiny_cfg, tiny_corpus

RANK = """
import json, sys
sys.path.insert(0, {root!r})
from tests.support.replay import HOST, fresh, tiny_cfg, tiny_corpus
from trainer.commit import CommitJob, param_tensors
from trainer.ddp import init_from_env, run_committed_ddp
from replay.step import configure_determinism
from nodekit.statestore import StateStore
configure_determinism(1)
ex = init_from_env("gloo")
cfg = tiny_cfg()
model, opt = fresh(cfg)
job = CommitJob(cfg, tiny_corpus(), HOST, 0, exchange=ex, start_params=param_tensors(model),
                base_model_hash="a" * 64, store=StateStore({store!r}) if ex.rank == 0 else None)
c = run_committed_ddp(job, model, opt)
if c is not None:
    print(json.dumps({{"leaves": c.leaves, "micro_batches": c.env.micro_batches}}))
import torch.distributed as dist
dist.barrier()  # leave the group together: a rank exiting under a live gloo pair can abort
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_thread() -> None:
    """The replay must be bitwise; conftest gives torch's globals back afterwards."""
    configure_determinism(1)


def test_two_gloo_ranks_commit_a_trajectory_that_replays_in_one_process(
    tmp_path: Path, one_thread: None
) -> None:
    code = RANK.format(root=str(ROOT), store=str(tmp_path / "store"))
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    assert outs[1][0].strip() == ""  # only rank 0 speaks for the host
    leaves = result["leaves"]
    assert result["micro_batches"] == 2  # committed, so a verifier replays with the same slicing
    cfg = tiny_cfg()
    assert len(leaves) == cfg.n_segments + 1

    store = StateStore(tmp_path / "store")
    data = tiny_corpus()

    def replay(micro_batches: int) -> str:
        model, opt = fresh(cfg)
        load_training_state(model, opt, store.get(leaves[1], 0))
        train_segment(TrainJob(cfg, data, HOST, 0, micro_batches=micro_batches), model, opt, 5, 5)
        return training_hash(training_state(model, opt))

    assert replay(2) == leaves[2]
    assert replay(1) != leaves[2]  # the slice structure is part of what is replayed
