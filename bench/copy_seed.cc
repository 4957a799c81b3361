// The seed articles' copy loops, for bench/run_copy_bench:
//
//   copy_seed stdio  SRC DST   8 KiB fread/fwrite loop ("IO": a buffered
//                              stream, the library copies through its buffer)
//   copy_seed aligned SRC DST  8 KiB read/write loop on a page-aligned buffer
//                              ("NIO": a channel with a direct buffer)
//   copy_seed cfr    SRC DST   the kernel's path-to-path copy
//                              (copy_file_range until end of file)
//
// Each prints nothing and exits 0 on success; errors go to stderr, exit 1.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr size_t kBuf = 8192;

int Die(const char* what, const char* path) {
  std::fprintf(stderr, "copy_seed: %s: %s: %s\n", what, path,
               std::strerror(errno));
  return 1;
}

int Stdio(const char* src, const char* dst) {
  FILE* in = std::fopen(src, "rb");
  if (in == nullptr) return Die("open", src);
  FILE* out = std::fopen(dst, "wb");
  if (out == nullptr) return Die("open", dst);
  char buf[kBuf];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) {
    if (std::fwrite(buf, 1, n, out) != n) return Die("write", dst);
  }
  if (std::ferror(in)) return Die("read", src);
  std::fclose(in);
  if (std::fclose(out) != 0) return Die("close", dst);
  return 0;
}

int Aligned(const char* src, const char* dst) {
  const int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return Die("open", src);
  const int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return Die("open", dst);
  void* mem = nullptr;
  if (posix_memalign(&mem, 4096, kBuf) != 0) return Die("alloc", src);
  char* buf = static_cast<char*>(mem);
  for (;;) {
    const ssize_t n = read(in, buf, kBuf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Die("read", src);
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = write(out, buf + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Die("write", dst);
      done += w;
    }
  }
  std::free(mem);
  close(in);
  if (close(out) != 0) return Die("close", dst);
  return 0;
}

int Cfr(const char* src, const char* dst) {
  const int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return Die("open", src);
  const int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return Die("open", dst);
  for (;;) {
    const ssize_t n =
        copy_file_range(in, nullptr, out, nullptr, size_t{1} << 30, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Die("copy_file_range", dst);
    if (n == 0) break;
  }
  close(in);
  if (close(out) != 0) return Die("close", dst);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: copy_seed stdio|aligned|cfr SRC DST\n");
    return 2;
  }
  if (std::strcmp(argv[1], "stdio") == 0) return Stdio(argv[2], argv[3]);
  if (std::strcmp(argv[1], "aligned") == 0) return Aligned(argv[2], argv[3]);
  if (std::strcmp(argv[1], "cfr") == 0) return Cfr(argv[2], argv[3]);
  std::fprintf(stderr, "copy_seed: unknown mode %s\n", argv[1]);
  return 2;
}
