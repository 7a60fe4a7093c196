"""Issue 45.4: a process executor's worker imports jax only when its scorer does. End-to-end (a training
process of its own: the forkserver is one per process; tests/conftest.py's E2E_FILES)."""

import os

FOOTPRINT = """
import sys
import numpy as np

def main():
    import jax  # noqa: F401  (the training process has jax)
    import anyio
    import scorers_for_tests as st
    from prm_jax import PRMRunner
    from prm_jax.runtime._arrays import score_arrays

    async def run():
        async with PRMRunner(scorers=(st.Footprint(max_workers=1),)) as runner:
            out = await score_arrays(runner, np.arange(1, 5, dtype=np.int32).reshape(1, 4),
                                     np.array([[-1, 0, 0, 0]], np.int32))
        print(float(out[0, 1]))

    anyio.run(run)

if __name__ == "__main__":
    main()
"""


def test_a_worker_process_imports_jax_only_when_its_scorer_does(tmp_path):
    # Issue 45.4: every worker's parent (the forkserver) imported prm_jax and with it jax (here: 83 MB a worker,
    # 340 MB where jax's backends load); now a worker holds what its scorer imports (30 MB for this one). In a
    # fresh process: the forkserver is one per process, and preloads the module of the first process scorer.
    import subprocess
    import sys

    script = tmp_path / "footprint.py"
    script.write_text(FOOTPRINT)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0.0"]  # jax was not in the worker's modules
