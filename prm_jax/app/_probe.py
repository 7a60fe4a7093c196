"""``--probe``: one small request to every served scorer of a config before any input is read, so a wrong
URL, a server that is down or a wrong model name shows in a second, with the endpoint, its status, the
model that answered and the round trip, instead of after the whole input was read."""

from __future__ import annotations

import anyio

from prm_jax.config._experiment import ExperimentConfig
from prm_jax.runtime._runner import PRMRunner
from prm_jax.scorers._http import Probe


async def probe_scorers(config: ExperimentConfig) -> list[Probe]:
    """Each enabled scorer that serves over HTTP (it has ``probe()``), probed concurrently, in the config's
    order; the runner that built them is closed before this returns."""
    runner = await PRMRunner.create(config) if config.rollout.version == "v2" else PRMRunner(config)
    try:
        served = [s for s in runner.scorers if s.enabled and callable(getattr(s, "probe", None))]
        probes: list[Probe | None] = [None] * len(served)

        async def one(i: int) -> None:
            probes[i] = await served[i].probe()  # type: ignore[attr-defined]

        async with anyio.create_task_group() as group:
            for i in range(len(served)):
                group.start_soon(one, i)
    finally:
        await runner.aclose()
    return [p for p in probes if p is not None]


def probe_lines(config: ExperimentConfig) -> tuple[list[str], list[Probe]]:
    """The probe's report, one line per served scorer, and the probes that failed."""
    probes = anyio.run(probe_scorers, config)
    if not probes:
        return ["probe: no served scorer in the config (nothing to probe)"], []
    return [probe.line() for probe in probes], [probe for probe in probes if not probe.ok]
