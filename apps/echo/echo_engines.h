// Private pieces shared by the echo server engines (apps/echo/*_server.cc).
#ifndef BUFPOOL_APPS_ECHO_ECHO_ENGINES_H_
#define BUFPOOL_APPS_ECHO_ECHO_ENGINES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bufpool/budget.h"
#include "bufpool/chain.h"
#include "echo/echo_server.h"

namespace bufpool {

// Written by the Run() thread only; read by Stats() from any thread.
// Relaxed everywhere: each counter is a statistic on its own, and Stats() is
// exact once Run() has returned (thread join orders it).
struct EchoServer::Counters {
  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_open{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> buffers_holding_data{0};
  std::atomic<uint64_t> buffers_holding_data_high_water{0};
  std::atomic<uint64_t> pool_dry_stalls{0};
  std::atomic<uint64_t> unsent_limit_stalls{0};

  // Single writer, so load + store is enough (no read-modify-write).
  static void Add(std::atomic<uint64_t>& c, uint64_t n) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  static void Sub(std::atomic<uint64_t>& c, uint64_t n) {
    c.store(c.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  }
  void AddHolding(uint64_t n) {
    const uint64_t now =
        buffers_holding_data.load(std::memory_order_relaxed) + n;
    buffers_holding_data.store(now, std::memory_order_relaxed);
    if (now > buffers_holding_data_high_water.load(std::memory_order_relaxed)) {
      buffers_holding_data_high_water.store(now, std::memory_order_relaxed);
    }
  }
};

namespace net {

// Distinct pool buffers that `chain`'s slices hold bytes of, for
// buffers_holding_data: a run of adjacent slices of one buffer counts once
// (slices of one buffer sit next to each other in what the receive paths
// build). O(slices).
inline size_t BuffersHoldingData(const BufferChain& chain) {
  size_t n = 0;
  for (size_t i = 0; i < chain.slice_count(); ++i) {
    const SharedBuffer& s = chain.slice(i);
    if (i == 0 || s.pool() != chain.slice(i - 1).pool() ||
        s.slot() != chain.slice(i - 1).slot()) {
      ++n;
    }
  }
  return n;
}

// A connection's backpressure (the pooled engines): a budget of
// max_unsent_bytes rounded up to whole buffers (at least one), whose high
// watermark is that limit and low watermark half of it, so on_high runs
// when the connection's unsent bytes pin the limit (stop reading) and
// on_low once they have drained to half (read again). The callbacks only
// set flags: they run inside the connection's chain calls.
inline absl::StatusOr<std::unique_ptr<BufferBudget>> MakeConnectionBudget(
    BufferPool& pool, size_t max_unsent_bytes, int fd,
    std::function<void()> on_high, std::function<void()> on_low) {
  const size_t bs = pool.buffer_size();
  const size_t limit =
      std::max<size_t>(bs, max_unsent_bytes > ~size_t{0} - bs
                               ? ~size_t{0} / bs * bs
                               : (max_unsent_bytes + bs - 1) / bs * bs);
  return pool.CreateBudget({.name = absl::StrCat("conn ", fd),
                            .max_bytes = limit,
                            .high_watermark = limit,
                            .low_watermark = limit / 2,
                            .on_high = std::move(on_high),
                            .on_low = std::move(on_low)});
}

// Engines are subclasses of EchoServer; Create() fills in the listening
// socket, the stop eventfd and the address after constructing one, and Run()
// uses them. Both descriptors stay owned by EchoServer.
// The epoll engine, pooled (kEpoll) or allocating per read (kMalloc).
std::unique_ptr<EchoServer> MakeEpollEchoServer(
    const EchoServerOptions& options);
// The io_uring engine; an error when io_uring (or provided-buffer rings) is
// unavailable, so that Create() can fall back to epoll.
absl::StatusOr<std::unique_ptr<EchoServer>> MakeUringEchoServer(
    const EchoServerOptions& options);

}  // namespace net
}  // namespace bufpool

#endif  // BUFPOOL_APPS_ECHO_ECHO_ENGINES_H_
