"""One process of the multi-process test: feeds its local rows, computes, saves its shard of the result."""

import os
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, process_id, num_processes, out_path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                           process_id=process_id, initialization_timeout=60)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from batches import make_batch  # noqa: E402
from multiprocess_config import CONFIG, ROWS, SEED, WIDTH  # noqa: E402

from prm_jax import compute_advantages  # noqa: E402

batch = make_batch(np.random.default_rng(SEED), rows=ROWS, width=WIDTH)
mesh = Mesh(np.array(jax.devices()), ("data",))
per_process = ROWS // num_processes
mine = slice(process_id * per_process, (process_id + 1) * per_process)
global_batch = {}
for key, value in batch.items():
    spec = P("data") if np.ndim(value) == 1 else P("data", None)
    global_batch[key] = jax.make_array_from_process_local_data(NamedSharding(mesh, spec), value[mine])
out = compute_advantages(global_batch, CONFIG)
local = {}
for field in ("advantages", "returns", "kl_rewards", "tot_rewards"):
    shards = sorted(getattr(out, field).addressable_shards, key=lambda s: s.index[0].start)
    local[field] = np.concatenate([np.asarray(s.data) for s in shards])
    local["rows"] = np.concatenate([np.arange(ROWS)[s.index[0]] for s in shards])
np.savez(out_path, **local)
jax.distributed.shutdown()
