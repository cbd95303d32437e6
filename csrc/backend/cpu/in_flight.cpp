#include "backend/cpu/in_flight.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace mlx_fpqmm::cpu {

namespace {

// MLX never joins its stream threads: a product still running while the
// process's static destructors ran corrupted the heap at exit. Trivially
// destructible, so that it outlives every task.
std::atomic<int64_t> in_flight{0};

void count_task() {
  // A forked child has none of the parent's tasks.
  [[maybe_unused]] static const bool registered =
      pthread_atfork(nullptr, nullptr, [] { in_flight.store(0); }) == 0;
  in_flight.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

TaskInFlight::TaskInFlight() {
  count_task();
}

TaskInFlight::TaskInFlight(const TaskInFlight&) {
  count_task();
}

TaskInFlight::~TaskInFlight() {
  in_flight.fetch_sub(1, std::memory_order_release);
}

int64_t tasks_in_flight() {
  return in_flight.load(std::memory_order_acquire);
}

void wait_for_tasks(int64_t patience_ms) {
  using Clock = std::chrono::steady_clock;
  const auto patience = std::chrono::milliseconds(patience_ms);
  auto progress = Clock::now();
  for (int64_t last = tasks_in_flight();
       last > 0 && Clock::now() - progress < patience;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t now = tasks_in_flight();
    if (now < last) {
      progress = Clock::now();
    }
    last = now;
  }
}

}  // namespace mlx_fpqmm::cpu
