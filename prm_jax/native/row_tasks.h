// Row tasks on XLA's intra-op pool: the one place the native kernels split a [rows, width] batch into
// tasks, schedule them and complete the handler's future (gae_cpu.cc, turns_cpu.cc and otb_cpu.cc use it).
#ifndef PRM_JAX_NATIVE_ROW_TASKS_H_
#define PRM_JAX_NATIVE_ROW_TASKS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace prm_jax {

namespace ffi = xla::ffi;

// A future that is already complete, with `error` (or success).
inline ffi::Future Completed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  if (error.success()) {
    promise.SetAvailable();
  } else {
    promise.SetError(std::move(error));
  }
  return future;
}

// Runs `work(begin, end)` over rows [0, rows) and completes the returned future with `finish()` once
// every row is done. Tasks pay off only for large batches: each gets whole blocks of `lanes` rows (so a
// vectorized kernel never splits a block), at most one task per pool thread and one per 2^16 elements.
// The caller runs the first block of rows itself; the last task to finish calls `finish`. Buffers stay
// alive until the future completes, so `work` may capture raw pointers; it must capture nothing by
// reference.
template <typename Work, typename Finish>
ffi::Future ForRowTasks(ffi::ThreadPool pool, int64_t rows, int64_t width, int64_t lanes, Work work,
                        Finish finish) {
  const int64_t blocks = (rows + lanes - 1) / lanes;
  const int64_t workers = std::max<int64_t>(1, pool.num_threads());
  const int64_t tasks = std::min<int64_t>({workers, blocks, rows * width / (1 << 16) + 1});
  if (tasks <= 1) {
    work(int64_t{0}, rows);
    return Completed(finish());
  }
  const int64_t per_task = (blocks + tasks - 1) / tasks * lanes;
  const int64_t num_tasks = (rows + per_task - 1) / per_task;
  struct Pending {
    Pending(int64_t count, ffi::Promise done) : remaining(count), promise(std::move(done)) {}
    std::atomic<int64_t> remaining;
    ffi::Promise promise;
  };
  ffi::Promise promise;
  ffi::Future done(promise);
  auto pending = std::make_shared<Pending>(num_tasks, std::move(promise));
  auto run = [=](int64_t begin, int64_t end) {
    work(begin, end);
    if (pending->remaining.fetch_sub(1) == 1) {
      ffi::Error error = finish();
      if (error.success()) {
        pending->promise.SetAvailable();
      } else {
        pending->promise.SetError(std::move(error));
      }
    }
  };
  for (int64_t begin = per_task; begin < rows; begin += per_task) {
    const int64_t end = std::min(rows, begin + per_task);
    pool.Schedule([=]() { run(begin, end); });
  }
  run(0, std::min(rows, per_task));
  return done;
}

}  // namespace prm_jax

#endif  // PRM_JAX_NATIVE_ROW_TASKS_H_
