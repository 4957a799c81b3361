// Private to bufpool-copy: its command line, parsed with CLI11 (see
// cli_common.h for the conventions).
#ifndef BUFPOOL_TOOLS_COPY_ARGS_H_
#define BUFPOOL_TOOLS_COPY_ARGS_H_

#include <optional>
#include <string>
#include <vector>

#include "bufpool/file_copy.h"
#include "cli_common.h"

namespace bufpool::tools {

// CopyOptions' limits, as CopyFile and BufferPool::Create check them.
inline constexpr size_t kMaxCopyBatchBuffers =
    CopyOptions::kMaxBatchBuffers;  // --batch-buffers
inline constexpr size_t kMaxCopyQueueDepth =
    CopyOptions::kMaxQueueDepth;  // --queue-depth
// One read or write moves at most buffer_size * batch_buffers bytes; above
// this it would pass Linux's 2 GiB per-call limit and io_uring's 32-bit
// lengths.
inline constexpr uint64_t kMaxCopyBytesPerOperation = uint64_t{1} << 30;
// The largest of the methods' default batch_buffers (256, with O_DIRECT).
inline constexpr size_t kLargestDefaultBatchBuffers = 256;

struct CopyCommand {
  // Two or more operands: sources, then the target (a file, or the
  // directory they go into). Never "-", never empty.
  std::vector<std::string> sources;
  std::string target;
  // method, buffer_size, batch_buffers, queue_depth, direct_io, fsync,
  // replace (--atomic), no_clobber (-n) and preserve_* (-p, --preserve),
  // all within the limits above; pool and progress are left unset.
  CopyOptions copy;
  bool recursive = false;  // -r, -R: directories with CopyTree
  bool verify = false;
  bool json = false;
  bool verbose = false;  // --verbose: how each copy ran, on stderr
  // --progress / --no-progress, the last one given; nullopt when neither
  // was (then: show progress when stderr is a terminal).
  std::optional<bool> progress;
};

// Parses bufpool-copy's argv. Never exits, prints or touches a file.
ParsedArgs<CopyCommand> ParseCopyArgs(int argc, const char* const* argv);

}  // namespace bufpool::tools

#endif  // BUFPOOL_TOOLS_COPY_ARGS_H_
