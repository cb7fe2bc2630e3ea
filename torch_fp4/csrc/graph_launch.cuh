// A fixed sequence of launches enqueued as one CUDA graph launch: the host pays one graph launch
// plus one kernel-node update per launch instead of one kernel launch each. The graph is built
// from the sequence's first enqueue (stream capture on a private stream, so PDL launches become
// programmatic edges as they would in a caller's capture); every later call records its launches
// (launch_record.cuh), writes their arguments into the graph's kernel nodes and launches the
// graph on the caller's stream. A graph launch is ordered after earlier work on the stream and
// after earlier launches of the same graph, and a node update does not touch launches already
// enqueued. When the stream is being captured (the caller is recording its own graph), when
// building failed, or when the PDL choice differs from the graph's, the launches are enqueued
// directly, as without a graph.
#pragma once

#include <cstring>
#include <mutex>

#include <cuda_runtime.h>

#include "launch_record.cuh"

namespace torch_fp4 {

// This thread in relaxed stream-capture mode for its lifetime (cudaThreadExchangeStreamCaptureMode):
// CUDA calls that are not stream work (creating and destroying graphs and private streams) may then
// run while a caller captures a stream, without invalidating its capture.
class CaptureModeRelaxed {
 public:
  CaptureModeRelaxed() { exchanged_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~CaptureModeRelaxed() {
    if (exchanged_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  CaptureModeRelaxed(const CaptureModeRelaxed&) = delete;
  CaptureModeRelaxed& operator=(const CaptureModeRelaxed&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

struct LaunchGraph {
  enum State : int { kEmpty = 0, kBuilt = 1, kBroken = 2 };
  std::mutex mutex;
  State state = kEmpty;
  bool pdl = false;
  int nodes = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t node[LaunchRecord::kMaxLaunches] = {};   // node[i] runs the call's i-th launch

  ~LaunchGraph() {
    // Runs from a Python finalizer, possibly while this thread (or another, in global mode)
    // captures a stream: the destroys are not stream work, so they run in relaxed capture mode,
    // which lets them proceed without invalidating that capture.
    const CaptureModeRelaxed relaxed;
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

namespace graph_launch_detail {

inline bool same_shape(const RecordedLaunch& r, const cudaKernelNodeParams& p) {
  return r.grid.x == p.gridDim.x && r.grid.y == p.gridDim.y && r.grid.z == p.gridDim.z && r.block.x == p.blockDim.x &&
         r.block.y == p.blockDim.y && r.block.z == p.blockDim.z && r.smem == p.sharedMemBytes;
}

inline bool same_launch(const RecordedLaunch& r, const cudaKernelNodeParams& p) {
  if (r.func != p.func || !same_shape(r, p) || p.kernelParams == nullptr) return false;
  for (int a = 0; a < r.args; ++a) {
    if (std::memcmp(p.kernelParams[a], r.arg[a], r.arg_bytes[a]) != 0) return false;
  }
  return true;
}

// g's graph and its node for each of `record`'s launches, from enqueue's launches captured on a
// private stream (the same arguments as record's); false when any step fails.
template <class Enqueue>
bool build(LaunchGraph& g, const LaunchRecord& record, bool pdl, Enqueue& enqueue) {
  const CaptureModeRelaxed relaxed;   // another stream of this thread may be under capture
  cudaStream_t side = nullptr;
  if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) return false;
  bool ok = cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    const bool launched = enqueue(side);
    cudaGraph_t graph = nullptr;
    ok = cudaStreamEndCapture(side, &graph) == cudaSuccess && launched && graph != nullptr;
    g.graph = graph;
  }
  (void)cudaStreamDestroy(side);
  size_t n = 0;
  ok = ok && cudaGraphGetNodes(g.graph, nullptr, &n) == cudaSuccess && n == static_cast<size_t>(record.count);
  cudaGraphNode_t found[LaunchRecord::kMaxLaunches];
  ok = ok && cudaGraphGetNodes(g.graph, found, &n) == cudaSuccess;
  bool taken[LaunchRecord::kMaxLaunches] = {};
  for (size_t j = 0; ok && j < n; ++j) {
    cudaGraphNodeType type;
    cudaKernelNodeParams p{};
    ok = cudaGraphNodeGetType(found[j], &type) == cudaSuccess && type == cudaGraphNodeTypeKernel &&
         cudaGraphKernelNodeGetParams(found[j], &p) == cudaSuccess;
    int match = -1;
    for (int i = 0; ok && i < record.count; ++i) {
      if (!taken[i] && same_launch(record.launch[i], p)) {
        if (match >= 0) ok = false;   // two launches alike: which node runs which is unknown
        match = i;
      }
    }
    ok = ok && match >= 0;
    if (ok) {
      taken[match] = true;
      g.node[match] = found[j];
    }
  }
  ok = ok && cudaGraphInstantiate(&g.exec, g.graph, 0) == cudaSuccess;
  (void)cudaGetLastError();   // a failed step leaves no error behind for the caller's launches
  if (!ok) return false;
  g.nodes = record.count;
  g.pdl = pdl;
  return true;
}

}  // namespace graph_launch_detail

// Enqueues enqueue(stream)'s launches on `stream` through g (null: directly); the result is the
// entry point's status (capi.h): 0, kNotCompiled when enqueue returned false, or a CUDA error.
template <class Enqueue>
int launch_through_graph(LaunchGraph* g, cudaStream_t stream, bool pdl, Enqueue&& enqueue) {
  auto direct = [&] {
    const bool launched = enqueue(stream);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
    return launched ? 0 : kNotCompiled;
  };
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusActive;
  if (g == nullptr) return direct();
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return direct();
  }
  if (capture != cudaStreamCaptureStatusNone) return direct();
  std::lock_guard<std::mutex> lock(g->mutex);
  if (g->state == LaunchGraph::kBroken || (g->state == LaunchGraph::kBuilt && g->pdl != pdl)) return direct();
  LaunchRecord record;
  bool launched;
  {
    RecordLaunches scope(record);
    launched = enqueue(stream);
  }
  if (!launched) return kNotCompiled;
  if (record.overflow) return direct();
  if (g->state == LaunchGraph::kEmpty) {
    if (!graph_launch_detail::build(*g, record, pdl, enqueue)) {
      g->state = LaunchGraph::kBroken;
      return direct();
    }
    g->state = LaunchGraph::kBuilt;
  }
  if (record.count != g->nodes) return direct();
  for (int i = 0; i < record.count; ++i) {
    const RecordedLaunch& r = record.launch[i];
    cudaKernelNodeParams p{};
    p.func = const_cast<void*>(r.func);
    p.gridDim = r.grid;
    p.blockDim = r.block;
    p.sharedMemBytes = r.smem;
    p.kernelParams = const_cast<void**>(r.arg);
    const cudaError_t e = cudaGraphExecKernelNodeSetParams(g->exec, g->node[i], &p);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return static_cast<int>(cudaGraphLaunch(g->exec, stream));
}

}  // namespace torch_fp4
