#include "backend/cpu/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace mlx_fpqmm::cpu {

namespace {

// Workers and the caller poll for a while before sleeping: waking a thread
// from a futex costs tens of microseconds (more in VMs), as much as a whole
// matrix-vector product of a few MiB, and calls come back to back while a
// model generates. Long enough to span one layer's other work, short enough
// that an idle process gives its cores back at once.
constexpr auto kSpinTime = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls ready() until it holds or kSpinTime has passed; returns ready().
template <typename Ready>
bool spin_until(Ready&& ready) {
  auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  while (!ready()) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return ready();
    }
  }
  return true;
}

// MLX_FPQMM_NUM_THREADS, a positive integer, up to kMaxThreads (every job
// wakes every worker: thousands of threads slow each product down and can
// take a machine's process IDs); unset or empty: the hardware concurrency.
constexpr int kMaxThreads = 256;

int configured_threads() {
  const char* value = std::getenv("MLX_FPQMM_NUM_THREADS");
  if (value == nullptr || *value == '\0') {
    return std::max(1u, std::thread::hardware_concurrency());
  }
  const std::string_view text(value);
  int requested = 0;
  const auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), requested);
  if (error == std::errc::result_out_of_range && text.front() != '-') {
    return kMaxThreads;
  }
  if (error != std::errc() || end != text.data() + text.size() ||
      requested < 1) {
    throw std::invalid_argument(
        "MLX_FPQMM_NUM_THREADS='" + std::string(text) +
        "' is not a positive integer (the threads of mlx_fpqmm's CPU "
        "kernels, up to " +
        std::to_string(kMaxThreads) + ").");
  }
  return std::min(requested, kMaxThreads);
}

class ThreadPool {
 public:
  // Up to `threads` - 1 workers besides the caller: as many as the system
  // lets start (a process or cgroup limit may refuse some; the pool then
  // runs on those that did).
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) {
      try {
        std::thread([this] { work(); }).detach();
      } catch (const std::system_error&) {
        break;
      }
      ++workers_;
    }
  }

  int size() const {
    return workers_ + 1;
  }

  void run(
      int64_t n,
      int64_t grain,
      const std::function<void(int64_t, int64_t)>& body) {
    std::unique_lock submit(submit_mutex_, std::try_to_lock);
    int64_t chunks = (n + grain - 1) / grain;
    if (!submit.owns_lock() || workers_ == 0 || chunks <= 1) {
      body(0, n);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      job_ = {&body, n, grain, chunks};
      next_chunk_ = 0;
      busy_workers_ = workers_;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_chunks();
    if (spin_until([this] { return busy_workers_.load() == 0; })) {
      return;
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return busy_workers_.load() == 0; });
  }

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* body = nullptr;
    int64_t n = 0;
    int64_t grain = 1;
    int64_t chunks = 0;
  };

  void run_chunks() {
    for (int64_t chunk = next_chunk_++; chunk < job_.chunks;
         chunk = next_chunk_++) {
      int64_t begin = chunk * job_.grain;
      (*job_.body)(begin, std::min(job_.n, begin + job_.grain));
    }
  }

  void work() {
    uint64_t seen = 0;
    auto has_job = [&] {
      return generation_.load(std::memory_order_acquire) != seen;
    };
    while (true) {
      if (!spin_until(has_job)) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, has_job);
      }
      seen = generation_.load(std::memory_order_acquire);
      run_chunks();
      std::lock_guard lock(mutex_);
      if (--busy_workers_ == 0) {
        done_.notify_one();
      }
    }
  }

  // The workers, detached: never joined (see get_pool).
  int workers_ = 0;
  std::mutex submit_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  Job job_;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> busy_workers_{0};
  // Bumped under mutex_ for each job, so a worker that stops polling and
  // waits on wake_ cannot miss one.
  std::atomic<uint64_t> generation_{0};
};

// The pool is created on first use; a forked child starts a fresh one
// because the parent's worker threads do not exist in it.
ThreadPool* pool = nullptr;
std::once_flag atfork_registered;

ThreadPool& get_pool() {
  std::call_once(atfork_registered, [] {
    pthread_atfork(nullptr, nullptr, [] { pool = nullptr; });
  });
  static std::mutex create_mutex;
  std::lock_guard lock(create_mutex);
  if (pool == nullptr) {
    // Never destroyed, its workers detached: joining threads during
    // interpreter shutdown can deadlock, and the OS reclaims them at exit.
    pool = new ThreadPool(configured_threads());
  }
  return *pool;
}

}  // namespace

int num_threads() {
  return get_pool().size();
}

void parallel_for(
    int64_t n,
    int64_t grain,
    const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) {
    return;
  }
  get_pool().run(n, std::max<int64_t>(grain, 1), body);
}

}  // namespace mlx_fpqmm::cpu
