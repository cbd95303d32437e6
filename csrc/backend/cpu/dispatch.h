// The CPU evaluation boilerplate of the primitives: allocate the output,
// declare the arrays to the stream's encoder, and run the work on it.
#pragma once

#include <utility>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

#include "backend/cpu/in_flight.h"
#include "backend/cpu/thread_pool.h"

namespace mlx_fpqmm::cpu {

namespace mx = mlx::core;

// Runs task(inputs, out) on `stream`'s CPU worker once the inputs are ready;
// an empty output needs no task.
template <typename Task>
void dispatch(
    mx::Stream stream,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    Task task) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& input : inputs) {
    encoder.set_input_array(input);
  }
  encoder.set_output_array(out);
  if (out.size() == 0) {
    return;
  }
  // The pool starts here, on the evaluating thread: a bad
  // MLX_FPQMM_NUM_THREADS raises from the evaluation, where inside the task
  // MLX would not report it.
  num_threads();
  // Views of the arrays, as MLX's own CPU ops take them (MLX keeps their
  // buffers until the task has run): a copy of an array would drop its graph
  // node on the stream's thread, racing the evaluating thread (a corrupted
  // heap at exit with products still queued).
  std::vector<mx::array> views;
  views.reserve(inputs.size());
  for (const auto& input : inputs) {
    views.push_back(mx::array::unsafe_weak_copy(input));
  }
  // The token is the first member, destroyed last: exit waits for the
  // views' release too.
  struct Work {
    TaskInFlight token;
    std::vector<mx::array> inputs;
    mx::array out;
    Task task;
  };
  encoder.dispatch(
      [work = Work{
           TaskInFlight(),
           std::move(views),
           mx::array::unsafe_weak_copy(out),
           std::move(task)}]() mutable { work.task(work.inputs, work.out); });
}

}  // namespace mlx_fpqmm::cpu
