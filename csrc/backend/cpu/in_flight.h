// Our CPU tasks queued or running, which the interpreter's exit waits for.
#pragma once

#include <cstdint>
#include <memory>

namespace mlx_fpqmm::cpu {

// A token a task holds until it is destroyed (run or dropped); copies count
// once.
std::shared_ptr<const void> task_in_flight();

// Tasks whose tokens are alive.
int64_t tasks_in_flight();

// Waits until no task is in flight, or none has finished for `patience_ms`
// (called from Python's atexit, before the interpreter and the libraries
// tear down).
void wait_for_tasks(int64_t patience_ms);

}  // namespace mlx_fpqmm::cpu
