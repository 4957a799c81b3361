#include "copy_args.h"

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace bufpool::tools {
namespace {

constexpr char kTool[] = "bufpool-copy";

constexpr char kUsage[] = R"(usage: bufpool-copy [OPTIONS] SRC DEST
       bufpool-copy [OPTIONS] SRC... DIR

Copies SRC to DEST, or each SRC into the directory DIR, as cp does: when the
last operand is an existing directory, SRC goes to DIR/<name of SRC>; with
more than one SRC the last operand must be a directory. An existing DEST is
written in place (its inode, mode, owner, group and hard links stay); a new
one gets SRC's mode without the set-ID and sticky bits, under the umask.
Devices and FIFOs are written, never replaced; a symbolic link is followed
(a dangling one refused). With --atomic an existing regular DEST is replaced
by a complete copy instead (a temporary file renamed over it), so a failed
copy leaves it as it was. Copying a file onto itself is refused and touches
nothing. After '--' every argument is an operand.

Differences from GNU cp:
  * '-' is refused, not read as standard input ('./-' names a file).
  * -r copies hard links as separate files (cp -R does too; no cp -a);
    sockets are reported and skipped; -n skips silently (exit 0).
  * -p never fails when ownership cannot be kept; no ACLs, xattrs,
    SELinux contexts, --reflink, --sparse, -i, -f, -u, -l, -s, -L.
  * --verify, --json, --method and the buffer flags are its own.

)";

constexpr char kMethods[] = R"(Methods (--method):
  auto        kernel for a regular file of nonzero size (copy_file_range
              keeps the bytes in the kernel), readwrite for anything else.
  readwrite   preadv/pwritev, gathering --buffer-count pooled buffers per
              call (by default 32 of 4 KiB: 128 KiB). Works everywhere; use
              it when the others are refused.
  direct      O_DIRECT on both files, many aligned reads and writes in
              flight through io_uring: bypasses the page cache, so copying a
              huge file does not evict everything else. Use for big files on
              real disks. Falls back to buffered I/O when the file system
              refuses O_DIRECT.
  uring       io_uring with the buffer pool registered as fixed buffers,
              reads and writes overlapped. Use for fast devices with a cold
              cache; add --direct-io to bypass the page cache.
  kernel      copy_file_range (then sendfile): the kernel moves the data
              without copying it to user space, and may reflink or offload
              it on file systems that can. Falls back to readwrite across
              file systems or where it is refused.
Memory: the copy holds --buffer-count buffers of --buffer-size bytes, times
--queue-depth for uring and direct.

)";

}  // namespace

ParsedArgs<CopyCommand> ParseCopyArgs(int argc, const char* const* argv) {
  ParsedArgs<CopyCommand> result;
  CopyCommand& c = result.command;
  CLI::App app;
  bool atomic = false;
  ConfigureApp(app, kTool, kUsage,
               absl::StrCat(kMethods,
                            ExitStatusHelp("a copy or a verification (the "
                                           "other\n     SRCs are still "
                                           "copied)"),
                            "  bufpool-copy: <what failed>: <path>: <the "
                            "system's words>\n"));

  std::string method = "auto";
  app.add_option("--method", method,
                 "how to move the bytes: auto, readwrite, direct,\n"
                 "uring or kernel (see Methods below; default: auto)")
      ->type_name("METHOD")
      ->option_text("METHOD")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            if (ParseCopyMethod(name).has_value()) return "";
            return absl::StrCat("unknown method '", name,
                                "' (auto, readwrite, direct, uring or "
                                "kernel)");
          },
          ""));
  app.add_flag("-n,--no-clobber", c.copy.no_clobber,
               "never overwrite an existing destination: skip that\n"
               "SRC (exit 0, as cp -n does; default: overwrite)");
  app.add_flag("-r,-R,--recursive", c.recursive,
               "copy directories and everything below them\n"
               "(default: a directory SRC is skipped, exit 1)");
  bool preserve_all = false;
  app.add_flag("-p", preserve_all,
               "same as --preserve=mode,ownership,timestamps\n"
               "(default: off)");
  std::string preserve;
  app.add_option("--preserve", preserve,
                 "keep these of SRC, comma-separated: mode,\n"
                 "ownership, timestamps, all (default: none)")
      ->type_name("LIST")
      ->option_text("LIST");
  app.add_flag("--atomic", atomic,
               "replace an existing regular DEST by renaming a\n"
               "complete copy over it (default: write in place)");
  app.add_option("--buffer-size", c.copy.buffer_size,
                 absl::StrCat("bytes per pool buffer, a power of two from 64 "
                              "to\n",
                              kMaxToolBufferSize,
                              " (default: ", kDefaultBufferSize, ")"))
      ->type_name("BYTES")
      ->option_text("BYTES")
      ->transform(PowerOfTwoIn(64, kMaxToolBufferSize));
  app.add_option("--buffer-count", c.copy.batch_buffers,
                 absl::StrCat("buffers gathered into one system call or "
                              "io_uring\noperation, 0 to ",
                              kMaxCopyBatchBuffers,
                              ", with buffer size x count at\nmost ",
                              kMaxCopyBytesPerOperation >> 20,
                              " MiB (default: 0, the method's: 32, or\n256 "
                              "with O_DIRECT)"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(0, kMaxCopyBatchBuffers));
  app.add_option("--queue-depth", c.copy.queue_depth,
                 absl::StrCat("operations in flight at once (uring, direct), "
                              "0\nto ",
                              kMaxCopyQueueDepth, " (default: 0, which is 4)"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(0, kMaxCopyQueueDepth));
  app.add_flag("--direct-io", c.copy.direct_io,
               "with --method=uring: open both files with O_DIRECT\n"
               "(default: off)");
  app.add_flag("--fsync", c.copy.fsync,
               "sync the data, and the directory after a new name\n"
               "(default: off)");
  bool progress = false;
  CLI::Option* progress_flag =
      app.add_flag("--progress,!--no-progress", progress,
                   "show progress on stderr, or never; the last one\n"
                   "given wins (default: shown when stderr is a\nterminal)");
  app.add_flag("--verify", c.verify,
               "after copying, re-read both files and compare them\n"
               "(regular destinations; a device or FIFO is not read back)\n"
               "(default: off)");
  app.add_flag("--json", c.json,
               "print each copy's statistics on stdout, one JSON\n"
               "object per line (default: off)");
  std::vector<std::string> operands;
  // Described in the usage paragraph; an empty group keeps it out of the
  // options list.
  app.add_option("operands", operands)->group("");

  result.action = RunParser(app, argc, argv, &result.text);
  if (result.action != ParseAction::kRun) return result;

  auto usage_error = [&](const std::string& message) {
    result.action = ParseAction::kUsageError;
    result.text = UsageLine(kTool, message);
    return result;
  };
  c.copy.method = *ParseCopyMethod(method);  // checked by the validator
  if (atomic) c.copy.replace = CopyOptions::Replace::kAtomic;
  if (preserve_all) {
    c.copy.preserve_mode = c.copy.preserve_ownership =
        c.copy.preserve_timestamps = true;
  }
  for (absl::string_view item :
       absl::StrSplit(preserve, ',', absl::SkipEmpty())) {
    if (item == "mode" || item == "all") c.copy.preserve_mode = true;
    if (item == "ownership" || item == "all") c.copy.preserve_ownership = true;
    if (item == "timestamps" || item == "all")
      c.copy.preserve_timestamps = true;
    if (item != "mode" && item != "ownership" && item != "timestamps" &&
        item != "all") {
      return usage_error(
          absl::StrCat("--preserve: unknown attribute '", item,
                       "' (mode, ownership, timestamps or all)"));
    }
  }
  if (progress_flag->count() > 0) c.progress = progress;
  if (operands.size() < 2) {
    return usage_error(
        operands.empty()
            ? "missing SRC and DEST operands"
            : absl::StrCat("missing the destination operand after '",
                           operands[0], "'"));
  }
  for (const std::string& op : operands) {
    if (op == "-") {
      return usage_error(
          "'-' (standard input or output) is not supported: name a file "
          "(a pipe can be read as /dev/stdin; a file named '-' is ./-)");
    }
    if (op.empty()) return usage_error("an operand is an empty path");
  }
  // With the default count the product stays within the limit (checked
  // at compile time below), so only an explicit --buffer-count can pass it.
  static_assert(kMaxToolBufferSize * kLargestDefaultBatchBuffers <=
                kMaxCopyBytesPerOperation);
  if (uint64_t{c.copy.buffer_size} * c.copy.batch_buffers >
      kMaxCopyBytesPerOperation) {
    return usage_error(absl::StrCat(
        "--buffer-size ", c.copy.buffer_size, " x --buffer-count ",
        c.copy.batch_buffers, " is over ", kMaxCopyBytesPerOperation >> 20,
        " MiB per operation; lower one of them"));
  }
  c.target = operands.back();
  operands.pop_back();
  c.sources = std::move(operands);
  return result;
}

}  // namespace bufpool::tools
