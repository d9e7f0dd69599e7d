"""The public reference: torchft's `DiLoCo` on CPU (gloo), M replica groups as threads of one process.

Each replica has its own torchft `Manager`, `ProcessGroupGloo` and TCPStore; an in-process
`LighthouseServer` forms the quorum. The inner loop is the same as ours: the same model init, the
same PRF batches per host, `replay.step.make_optimizer` (AdamW, DiLoCo defaults) and grad clipping;
the outer optimizer is `torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True)` as in torchft's own
tests. torchft averages fp32 pseudo-gradients with an all-reduce: no codec, no verification.

Needs `pip install torchft==0.2.0 torch==2.13.0` (the `bench` extra); without it the convergence
benchmark reports the import error instead of a number.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch

from bench.sim import Setup, evaluate, make_env, n_params
from replay.data import batch
from replay.model import lm_loss
from replay.spec import build_model
from replay.step import make_optimizer
from trainer.commit import param_tensors


def run_torchft(setup: Setup, *, save_params: str | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Train M torchft replicas for T·H inner steps; replica 0 evaluates after every outer step."""
    from torch.distributed import TCPStore
    from torchft._torchft import LighthouseServer
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    env = make_env(setup)
    cfg = env.cfg
    H, M = setup.inner_steps, setup.hosts
    timeout = timedelta(seconds=timeout_s)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=M)
    curve: list[dict[str, Any]] = []
    finals: dict[int, dict[str, torch.Tensor]] = {}
    barrier = threading.Barrier(M, timeout=timeout_s)
    ring = 2 * (M - 1) / M * 4 * n_params(param_tensors(build_model(setup.spec())))  # fp32 per sync

    def replica(i: int) -> None:
        host = env.hosts[i]
        model = build_model(setup.spec())
        evaluator = build_model(setup.spec()) if i == 0 else None
        inner = make_optimizer(model, cfg.inner)
        params = list(model.parameters())
        outer = torch.optim.SGD(params, lr=cfg.outer.lr, momentum=cfg.outer.momentum, nesterov=True)
        store = TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)

        def state_dict() -> dict[str, Any]:
            return {"model": model.state_dict(), "inner": inner.state_dict()}

        def load_state_dict(sd: dict[str, Any]) -> None:
            model.load_state_dict(sd["model"])
            inner.load_state_dict(sd["inner"])

        manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout), min_replica_size=M, use_async_quorum=False,
            load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"replica{i}",
            store_addr="localhost", store_port=store.port, rank=0, world_size=1,
            lighthouse_addr=lighthouse.address(), port=0, init_sync=False,
            timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
        )  # fmt: skip
        try:
            with DiLoCo(manager, [model], inner, outer, sync_every=H, pin_memory=False):
                for t in range(setup.outer_steps * H):
                    n, k = divmod(t, H)
                    x, y = batch(cfg, env.corpus, host, n, k)
                    inner.zero_grad(set_to_none=True)
                    lm_loss(model(x), y).backward()
                    torch.nn.utils.clip_grad_norm_(params, cfg.inner.grad_clip)
                    inner.step()  # the DiLoCo post-hook syncs every H steps
                    if (t + 1) % H == 0 and evaluator is not None:
                        loss = evaluate(env, evaluator, param_tensors(model))
                        curve.append({"outer_step": n + 1, "inner_steps": t + 1, "val_loss": loss,
                                      "bytes_per_host": ring * (n + 1)})  # fmt: skip
            finals[i] = param_tensors(model)
            barrier.wait()  # nobody shuts down while others still need the group
        finally:
            manager.shutdown(wait=False)

    init = build_model(setup.spec())
    l0 = evaluate(env, init, param_tensors(init))
    curve.append({"outer_step": 0, "inner_steps": 0, "val_loss": l0, "bytes_per_host": 0})
    try:
        with ThreadPoolExecutor(max_workers=M, thread_name_prefix="replica") as pool:
            for f in [pool.submit(replica, i) for i in range(M)]:
                f.result()
    finally:
        lighthouse.shutdown()
    g = finals[0]
    spread = max(
        float((finals[i][n] - g[n]).abs().max()) for i in range(1, M) for n in g
    ) if M > 1 else 0.0  # fmt: skip
    if save_params:
        from safetensors.torch import save_file

        save_file(g, save_params)
    p = n_params(g)
    return {
        "final_val_loss": curve[-1]["val_loss"],
        "curve": sorted(curve, key=lambda r: r["inner_steps"]),
        "params": p,
        "bytes_per_host": ring * setup.outer_steps,  # fp32 ring all-reduce per sync
        "replica_max_abs_diff": spread,
        "torchft_version": _version(),
    }


def _version() -> str:
    from importlib.metadata import version

    return version("torchft")
