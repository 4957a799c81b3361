// libbufpool: moving a BufferChain through a socket, pipe or file with
// one readv or writev (sendmsg with MSG_NOSIGNAL on sockets). Included by
// bufpool/chain.h; thread safety and ownership are the chain's (one thread
// at a time per chain).
#ifndef BUFPOOL_CHAIN_IO_H_
#define BUFPOOL_CHAIN_IO_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "bufpool/chain.h"
#include "bufpool/export.h"

namespace bufpool {

// Status codes, to branch on:
//   kUnavailable         `fd` is non-blocking and has nothing to read / no
//                        room to write now (EAGAIN): retry when it is ready;
//                        the chain is unchanged.
//   kFailedPrecondition  the connection is gone: the peer closed it or reset
//                        it (EPIPE, ECONNRESET). SIGPIPE is never raised.
//   kResourceExhausted   (ReadFrom) the pool has no free buffer, or the
//                        chain's budget allows none more and the tail has
//                        no room (the message names the budget and its
//                        limit; nothing was read).
//   kInvalidArgument     a bad descriptor (EBADF), or max_bytes == 0.
//   others               the system's error (EIO, ...); the message names
//                        the call and the system's words.
// EINTR is retried.

// Reads up to `max_bytes` (> 0) from `fd` with one readv, into the tail's
// room (when the chain holds the only reference to the tail buffer) and
// then into fresh buffers from chain.pool() (at most 64 per call), appended
// to `chain`. Returns the bytes read, 0 at end of file. Buffers the read did
// not fill go straight back. When the pool (or the chain's budget) has
// fewer buffers than max_bytes needs, it reads into those it has;
// ResourceExhausted only when it has none (and there is no room).
// InvalidArgument for max_bytes == 0, FailedPrecondition for a chain without a
// pool.
BUFPOOL_EXPORT absl::StatusOr<size_t> ReadFrom(int fd, BufferChain& chain,
                                               size_t max_bytes);
// The same, each fresh buffer the read filled taken by
// BufferChain::Receive() with `options`: with a ReceivePack and copy_below,
// a chain left under copy_below bytes (a half-sent command) pins about
// its bytes, not a buffer; the buffer goes straight back.
BUFPOOL_EXPORT absl::StatusOr<size_t> ReadFrom(
    int fd, BufferChain& chain, size_t max_bytes,
    const BufferChain::ReceiveOptions& options);

// Writes `chain` to `fd` (sendmsg with MSG_NOSIGNAL on a socket, writev
// with SIGPIPE blocked on anything else), at most 256 slices per call,
// looping until the chain is empty or `fd` would block, and consumes what
// was written. Returns the bytes written: all of them on a blocking fd, a
// part on a non-blocking one whose buffer filled; kUnavailable when not one
// byte fit. On an error the bytes written before it are consumed too and the
// rest stay in the chain. An empty chain writes nothing and returns 0.
BUFPOOL_EXPORT absl::StatusOr<size_t> WriteTo(int fd, BufferChain& chain);

}  // namespace bufpool

#endif  // BUFPOOL_CHAIN_IO_H_
