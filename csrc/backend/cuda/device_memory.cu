#include "backend/cuda/device.h"
#include "backend/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>
#include <utility>

#include "mlx/backend/cuda/allocator.h"

namespace mlx_fpqmm::cuda {

namespace mx = mlx::core;

namespace {

// Sizes as MLX's allocator rounds them, so that buffers are reused across
// nearby sizes.
constexpr size_t kPageBytes = 16384;
constexpr size_t kCacheLimitBytes = size_t(1) << 30;

size_t rounded_size(size_t bytes) {
  if (bytes < kPageBytes) {
    return std::max<size_t>(256, std::bit_ceil(bytes));
  }
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

// Released device buffers by (device, size). Every buffer in it has been
// released by its array, which MLX does after the GPU has finished with it,
// so any stream may reuse it.
class BufferCache {
 public:
  mx::cu::CudaBuffer* take(int device, size_t size) {
    std::lock_guard lock(mutex_);
    auto it = free_.lower_bound({device, size});
    if (it == free_.end() || it->first.first != device ||
        it->first.second >= std::min(2 * size, size + 2 * kPageBytes)) {
      return nullptr;
    }
    auto* buf = it->second;
    cached_bytes_ -= buf->size;
    free_.erase(it);
    return buf;
  }

  // Keeps `buf` for reuse, or frees it where the cache is full.
  void give(mx::cu::CudaBuffer* buf) {
    {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + buf->size <= kCacheLimitBytes) {
        cached_bytes_ += buf->size;
        free_.emplace(std::pair{buf->device, buf->size}, buf);
        return;
      }
    }
    free_buffer(buf);
  }

  // Frees every cached buffer of `device`.
  void clear(int device) {
    std::lock_guard lock(mutex_);
    auto it = free_.lower_bound({device, 0});
    while (it != free_.end() && it->first.first == device) {
      cached_bytes_ -= it->second->size;
      free_buffer(it->second);
      it = free_.erase(it);
    }
  }

 private:
  // On a stream of its own (never destroyed, so that arrays released at
  // exit find it), as MLX frees its cached buffers.
  static void free_buffer(mx::cu::CudaBuffer* buf) {
    static std::mutex mutex;
    static std::map<int, cudaStream_t> streams;
    cudaStream_t stream = nullptr;
    {
      std::lock_guard lock(mutex);
      auto [it, fresh] = streams.try_emplace(buf->device, nullptr);
      if (fresh) {
        cudaSetDevice(buf->device);
        cudaStreamCreateWithFlags(&it->second, cudaStreamNonBlocking);
      }
      stream = it->second;
    }
    cudaFreeAsync(buf->data, stream);
    delete buf;
  }

  std::mutex mutex_;
  std::multimap<std::pair<int, size_t>, mx::cu::CudaBuffer*> free_;
  size_t cached_bytes_ = 0;
};

// The bytes of the buffers that our arrays hold.
std::atomic<size_t> live_bytes{0};

BufferCache& cache() {
  // Never destroyed: arrays may release their buffers after static
  // destructors have run.
  static auto* cache = new BufferCache;
  return *cache;
}

// The deleter of our arrays' data. A host read of the array (MLX's
// Buffer::raw_ptr) may have moved the data to managed or pinned host memory.
void release(mx::allocator::Buffer buffer) {
  auto* buf = static_cast<mx::cu::CudaBuffer*>(buffer.ptr());
  live_bytes -= buf->size;
  if (buf->device >= 0) {
    cache().give(buf);
    return;
  }
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, buf->data) == cudaSuccess &&
      attributes.type == cudaMemoryTypeHost) {
    cudaFreeHost(buf->data);
  } else {
    cudaFree(buf->data);
  }
  delete buf;
}

}  // namespace

mx::allocator::Data device_malloc(
    size_t bytes, mx::cu::CommandEncoder& encoder) {
  const int device = encoder.device().cuda_device();
  const size_t size = rounded_size(bytes);
  auto* buf = cache().take(device, size);
  if (!buf) {
    void* data = nullptr;
    if (cudaMallocAsync(&data, size, encoder.stream()) != cudaSuccess) {
      cudaGetLastError();
      cache().clear(device);
      if (cudaMallocAsync(&data, size, encoder.stream()) != cudaSuccess) {
        // Out of device memory: MLX's allocator, which can release its own
        // cache and says so when it cannot.
        cudaGetLastError();
        return mx::allocator::malloc(bytes);
      }
    }
    buf = new mx::cu::CudaBuffer{data, size, device};
  }
  live_bytes += buf->size;
  return mx::allocator::Data(mx::allocator::Buffer(buf), release);
}

size_t device_bytes_in_use() {
  return live_bytes;
}

}  // namespace mlx_fpqmm::cuda
