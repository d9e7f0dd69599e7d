"""Building Hugging Face models from several threads leaves torch's init functions alone.

transformers' `no_init_weights` swaps `torch.nn.init`'s functions for no-ops process-wide and puts
back what it found on exit. Two threads inside it at once (a host and a verifier in one process,
a verifier's replay pool) made the second save the first's no-ops as "originals" and restore them
last: every later `nn.Linear` in the process started from uninitialised memory (found as a test
of `trainer.diloco` failing only after `test_real_models` had run in the same pytest worker)."""

from __future__ import annotations

import threading

import torch
from torch import nn

from replay import hf

THREADS, ROUNDS = 4, 6


def _linear_init() -> torch.Tensor:
    torch.manual_seed(0)
    return nn.Linear(8, 8).weight.detach().clone()


def test_concurrent_hf_builds_leave_torch_init_as_it_was() -> None:
    before = {name: getattr(nn.init, name) for name in ("kaiming_uniform_", "uniform_", "normal_")}
    want = _linear_init()
    cfg = hf.spec_config("llama", "tiny")
    start = threading.Barrier(THREADS)
    built: list[dict[str, torch.Tensor]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(ROUNDS):
                start.wait(timeout=60)  # every thread enters the build at once
                model = hf.build("llama", **cfg)
                built.append({n: p.detach() for n, p in model.named_parameters()})
        except BaseException as e:  # asserted in the main thread: a worker's failure would be lost
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {name: getattr(nn.init, name) for name in before} == before
    assert torch.equal(_linear_init(), want)  # a plain module still gets torch's seeded init
    first = built[0]  # and every build of the same config is the same model (its own seeded init)
    assert len(built) == THREADS * ROUNDS
    assert all(all(torch.equal(b[n], t) for n, t in first.items()) for b in built[1:])
