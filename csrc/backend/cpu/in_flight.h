// Our CPU tasks queued or running, which the interpreter's exit waits for.
#pragma once

#include <cstdint>

namespace mlx_fpqmm::cpu {

// Held by a task until it is destroyed (run or dropped): each live copy
// counts (MLX copies a task while it queues it), none once the task is gone.
class TaskInFlight {
 public:
  TaskInFlight();
  TaskInFlight(const TaskInFlight&);
  TaskInFlight& operator=(const TaskInFlight&) = default;
  ~TaskInFlight();
};

// Live tokens.
int64_t tasks_in_flight();

// Waits until no task is in flight, or none has finished for `patience_ms`
// (called from Python's atexit, before the interpreter and the libraries
// tear down).
void wait_for_tasks(int64_t patience_ms);

}  // namespace mlx_fpqmm::cpu
