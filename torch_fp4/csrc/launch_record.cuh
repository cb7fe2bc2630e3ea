// Launch records: while a LaunchRecord is installed on the calling thread (RecordLaunches),
// launch_kernel and launch_cluster (pdl.cuh) store each launch's kernel, grid, block, dynamic
// shared memory and argument values instead of enqueuing it, and the caller applies them to the
// kernel nodes of a CUDA graph it instantiated from the same launches (graph_launch.cuh). The
// argument values are the kernel's parameter types, as cudaLaunchKernelEx would coerce them.
// Only these two launchers record: a sequence recorded this way must consist of their launches
// alone (any other stream operation would be enqueued at once).
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

namespace torch_fp4 {

struct RecordedLaunch {
  static constexpr int kMaxArgs = 16;
  static constexpr int kArgBytes = 4096;   // the kernel parameter limit before sm_90
  const void* func;
  dim3 grid, block;
  unsigned smem;
  int args;
  void* arg[kMaxArgs];      // pointers into storage, one per kernel parameter
  size_t arg_bytes[kMaxArgs];
  alignas(128) unsigned char storage[kArgBytes];   // CUtensorMap parameters are 64- or 128-byte aligned
};

struct LaunchRecord {
  static constexpr int kMaxLaunches = 8;
  RecordedLaunch launch[kMaxLaunches];
  int count = 0;
  bool overflow = false;    // more launches, arguments or argument bytes than the record holds

  template <typename... Params, typename... Args>
  void add(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, Args&&... args) {
    using Values = std::tuple<std::decay_t<Params>...>;
    static_assert(sizeof...(Params) <= RecordedLaunch::kMaxArgs, "too many kernel parameters to record");
    static_assert(sizeof(Values) <= RecordedLaunch::kArgBytes, "kernel parameters too large to record");
    static_assert(alignof(Values) <= 128, "kernel parameter alignment above 128 bytes");
    static_assert((std::is_trivially_copyable_v<std::decay_t<Params>> && ...), "kernel parameters must be trivially copyable");
    if (count == kMaxLaunches) {
      overflow = true;
      return;
    }
    RecordedLaunch& r = launch[count++];
    r.func = reinterpret_cast<const void*>(kernel);
    r.grid = grid;
    r.block = block;
    r.smem = static_cast<unsigned>(smem);
    r.args = static_cast<int>(sizeof...(Params));
    auto* values = new (r.storage) Values(static_cast<std::decay_t<Params>>(std::forward<Args>(args))...);
    point(r, *values, std::index_sequence_for<Params...>{});
  }

 private:
  template <typename Values, size_t... I>
  static void point(RecordedLaunch& r, Values& values, std::index_sequence<I...>) {
    ((r.arg[I] = &std::get<I>(values), r.arg_bytes[I] = sizeof(std::get<I>(values))), ...);
  }
};

// The calling thread's record, or null (launches are enqueued).
inline thread_local LaunchRecord* t_launch_record = nullptr;

// Installs `record` on this thread for the scope.
class RecordLaunches {
 public:
  explicit RecordLaunches(LaunchRecord& record) : previous_(t_launch_record) { t_launch_record = &record; }
  ~RecordLaunches() { t_launch_record = previous_; }
  RecordLaunches(const RecordLaunches&) = delete;
  RecordLaunches& operator=(const RecordLaunches&) = delete;

 private:
  LaunchRecord* previous_;
};

}  // namespace torch_fp4
