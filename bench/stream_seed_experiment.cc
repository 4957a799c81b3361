// The seed experiment for buffered record streams, on this machine.
//
// Writes N records of an int32, an int64 and a 6-byte string field by field,
// then reads them back field by field and checks every value, with:
//   (a) one system call per field (write(2)/read(2); run on fewer records and
//       scaled to N, as the output says),
//   (b) bufpool::BufferedWriter / BufferedReader (4 KiB pooled buffers),
//   (c) std::ofstream / std::ifstream, and fwrite / fread.
// Then reads one big file (page cache warm) with BufferedReader::Read into
// 64 KiB spans, with plain read(2) of 128 KiB, and with `dd bs=128k` to
// /dev/null. Prints a markdown table; writes CSV and JSON into --out.
//
//   stream_seed_experiment --out DIR [--records N] [--syscall-records M]
//                          [--big-mib S] [--reps R] [--data-dir D]
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "bufpool/buffered_stream.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "stream_seed_experiment: %s\n", msg.c_str());
  std::exit(1);
}

struct Record {
  int32_t a;
  int64_t b;
  char s[6];
};

Record MakeRecord(uint64_t i) {
  Record r;
  r.a = static_cast<int32_t>(i * 2654435761u);
  r.b = static_cast<int64_t>(i * 0x9E3779B97F4A7C15ull);
  for (int k = 0; k < 6; ++k) r.s[k] = static_cast<char>('a' + (i + k) % 26);
  return r;
}

// Order-sensitive checksum of records as read back.
struct Checker {
  uint64_t sum = 0;
  void Add(int32_t a, int64_t b, const char* s) {
    uint64_t h = static_cast<uint32_t>(a) ^ (static_cast<uint64_t>(b) * 31);
    for (int k = 0; k < 6; ++k) h = h * 131 + static_cast<unsigned char>(s[k]);
    sum = sum * 1099511628211ull + h;
  }
};

uint64_t ExpectedSum(uint64_t n) {
  Checker c;
  for (uint64_t i = 0; i < n; ++i) {
    const Record r = MakeRecord(i);
    c.Add(r.a, r.b, r.s);
  }
  return c.sum;
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The message is built only on failure: the loops below call this per field.
#define CHECK(cond, what)     \
  do {                        \
    if (!(cond)) Die((what)); \
  } while (0)

// ---- Contenders: each writes or reads `n` records of `path`, returns s ----

double WriteSyscalls(const std::string& path, uint64_t n) {
  const auto t0 = Clock::now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0, "open " + path + ": " + strerror(errno));
  for (uint64_t i = 0; i < n; ++i) {
    const Record r = MakeRecord(i);
    CHECK(write(fd, &r.a, 4) == 4 && write(fd, &r.b, 8) == 8 &&
              write(fd, r.s, 6) == 6,
          "write " + path);
  }
  CHECK(close(fd) == 0, "close " + path);
  return Seconds(t0);
}

double ReadSyscalls(const std::string& path, uint64_t n, uint64_t* sum) {
  const auto t0 = Clock::now();
  const int fd = open(path.c_str(), O_RDONLY);
  CHECK(fd >= 0, "open " + path + ": " + strerror(errno));
  Checker c;
  for (uint64_t i = 0; i < n; ++i) {
    Record r;
    CHECK(read(fd, &r.a, 4) == 4 && read(fd, &r.b, 8) == 8 &&
              read(fd, r.s, 6) == 6,
          "read " + path);
    c.Add(r.a, r.b, r.s);
  }
  close(fd);
  *sum = c.sum;
  return Seconds(t0);
}

double WriteBuffered(const std::string& path, uint64_t n,
                     bufpool::BufferPool& pool) {
  const auto t0 = Clock::now();
  auto w = bufpool::BufferedWriter::Open(path, pool);
  CHECK(w.ok(), w.status().ToString());
  for (uint64_t i = 0; i < n; ++i) {
    const Record r = MakeRecord(i);
    absl::Status s = w->AppendLE<uint32_t>(static_cast<uint32_t>(r.a));
    if (s.ok()) s = w->AppendLE<uint64_t>(static_cast<uint64_t>(r.b));
    if (s.ok()) s = w->Append(r.s, 6);
    CHECK(s.ok(), s.ToString());
  }
  absl::Status s = w->Close();
  CHECK(s.ok(), s.ToString());
  return Seconds(t0);
}

double ReadBuffered(const std::string& path, uint64_t n,
                    bufpool::BufferPool& pool, uint64_t* sum) {
  const auto t0 = Clock::now();
  auto r = bufpool::BufferedReader::Open(path, pool);
  CHECK(r.ok(), r.status().ToString());
  Checker c;
  for (uint64_t i = 0; i < n; ++i) {
    auto a = r->ReadLE<uint32_t>();
    auto b = r->ReadLE<uint64_t>();
    char s[6];
    absl::Status st =
        r->ReadExact({reinterpret_cast<std::byte*>(s), sizeof(s)});
    CHECK(a.ok() && b.ok() && st.ok(), "BufferedReader: short file " + path);
    c.Add(static_cast<int32_t>(*a), static_cast<int64_t>(*b), s);
  }
  *sum = c.sum;
  return Seconds(t0);
}

double WriteOfstream(const std::string& path, uint64_t n) {
  const auto t0 = Clock::now();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    CHECK(out.good(), "ofstream " + path);
    for (uint64_t i = 0; i < n; ++i) {
      const Record r = MakeRecord(i);
      out.write(reinterpret_cast<const char*>(&r.a), 4);
      out.write(reinterpret_cast<const char*>(&r.b), 8);
      out.write(r.s, 6);
    }
    out.close();
    CHECK(!out.fail(), "ofstream write " + path);
  }
  return Seconds(t0);
}

double ReadIfstream(const std::string& path, uint64_t n, uint64_t* sum) {
  const auto t0 = Clock::now();
  std::ifstream in(path, std::ios::binary);
  CHECK(in.good(), "ifstream " + path);
  Checker c;
  for (uint64_t i = 0; i < n; ++i) {
    Record r;
    in.read(reinterpret_cast<char*>(&r.a), 4);
    in.read(reinterpret_cast<char*>(&r.b), 8);
    in.read(r.s, 6);
    CHECK(in.good(), "ifstream: short file " + path);
    c.Add(r.a, r.b, r.s);
  }
  *sum = c.sum;
  return Seconds(t0);
}

double WriteStdio(const std::string& path, uint64_t n) {
  const auto t0 = Clock::now();
  FILE* f = std::fopen(path.c_str(), "wb");
  CHECK(f != nullptr, "fopen " + path);
  for (uint64_t i = 0; i < n; ++i) {
    const Record r = MakeRecord(i);
    CHECK(std::fwrite(&r.a, 4, 1, f) == 1 && std::fwrite(&r.b, 8, 1, f) == 1 &&
              std::fwrite(r.s, 6, 1, f) == 1,
          "fwrite " + path);
  }
  CHECK(std::fclose(f) == 0, "fclose " + path);
  return Seconds(t0);
}

double ReadStdio(const std::string& path, uint64_t n, uint64_t* sum) {
  const auto t0 = Clock::now();
  FILE* f = std::fopen(path.c_str(), "rb");
  CHECK(f != nullptr, "fopen " + path);
  Checker c;
  for (uint64_t i = 0; i < n; ++i) {
    Record r;
    CHECK(std::fread(&r.a, 4, 1, f) == 1 && std::fread(&r.b, 8, 1, f) == 1 &&
              std::fread(r.s, 6, 1, f) == 1,
          "fread: short file " + path);
    c.Add(r.a, r.b, r.s);
  }
  std::fclose(f);
  *sum = c.sum;
  return Seconds(t0);
}

// ---- Big sequential read
// -------------------------------------------------------

void MakeBigFile(const std::string& path, uint64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0, "open " + path + ": " + strerror(errno));
  std::vector<char> block(1 << 20);
  uint64_t x = 88172645463325252ull;
  for (uint64_t done = 0; done < bytes; done += block.size()) {
    for (size_t k = 0; k < block.size(); k += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(&block[k], &x, 8);
    }
    const size_t n = std::min<uint64_t>(block.size(), bytes - done);
    CHECK(write(fd, block.data(), n) == static_cast<ssize_t>(n),
          "write " + path);
  }
  CHECK(close(fd) == 0, "close " + path);
}

double ReadBigPlain(const std::string& path, uint64_t bytes,
                    size_t block = 128 << 10) {
  std::vector<char> buf(block);
  const auto t0 = Clock::now();
  const int fd = open(path.c_str(), O_RDONLY);
  CHECK(fd >= 0, "open " + path);
  uint64_t total = 0;
  ssize_t n;
  while ((n = read(fd, buf.data(), buf.size())) > 0) total += n;
  close(fd);
  const double s = Seconds(t0);
  CHECK(total == bytes, "read(2): short big file");
  return s;
}

double ReadBigBuffered(const std::string& path, uint64_t bytes,
                       bufpool::BufferPool& pool) {
  std::vector<std::byte> span(64 << 10);
  const auto t0 = Clock::now();
  auto r = bufpool::BufferedReader::Open(path, pool);
  CHECK(r.ok(), r.status().ToString());
  uint64_t total = 0;
  for (;;) {
    auto n = r->Read(absl::MakeSpan(span));
    CHECK(n.ok(), n.status().ToString());
    if (*n == 0) break;
    total += *n;
  }
  const double s = Seconds(t0);
  CHECK(total == bytes, "BufferedReader: short big file");
  return s;
}

double ReadBigDd(const std::string& path) {
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);  // dd's statistics
    const std::string in = "if=" + path;
    execlp("dd", "dd", in.c_str(), "of=/dev/null", "bs=128k",
           static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  const double s = Seconds(t0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "dd failed");
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t ParseCount(const char* flag, const char* value) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v == 0 || value[0] == '-') {
    Die(std::string(flag) + " wants a positive integer, got '" + value + "'");
  }
  return v;
}

struct Row {
  std::string what;
  uint64_t records;  // measured
  double write_s;    // scaled to the full record count
  double read_s;
  bool scaled;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t records = 4'000'000, syscall_records = 400'000, big_mib = 1024;
  int reps = 3;
  std::string out_dir, data_dir = "/var/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--records")
      records = ParseCount("--records", value());
    else if (a == "--syscall-records")
      syscall_records = ParseCount(a.c_str(), value());
    else if (a == "--big-mib")
      big_mib = ParseCount(a.c_str(), value());
    else if (a == "--reps")
      reps = static_cast<int>(ParseCount(a.c_str(), value()));
    else if (a == "--out")
      out_dir = value();
    else if (a == "--data-dir")
      data_dir = value();
    else
      Die("unknown argument '" + a + "'");
  }
  if (out_dir.empty()) Die("--out DIR is required");
  syscall_records = std::min(syscall_records, records);

  std::string tmpl = data_dir + "/bufpool_stream_bench.XXXXXX";
  CHECK(mkdtemp(tmpl.data()) != nullptr,
        "mkdtemp in " + data_dir + ": " + strerror(errno));
  const std::string dir = tmpl;
  const std::string file = dir + "/records";

  auto pool =
      bufpool::BufferPool::Create({.buffer_size = 4096, .buffer_count = 64});
  CHECK(pool.ok(), pool.status().ToString());

  const uint64_t want_full = ExpectedSum(records);
  const uint64_t want_small = ExpectedSum(syscall_records);
  std::vector<Row> rows;
  auto run = [&](const std::string& what, uint64_t n, int r,
                 const std::function<double(uint64_t)>& w,
                 const std::function<double(uint64_t, uint64_t*)>& rd) {
    std::vector<double> ws, rs;
    for (int k = 0; k < r; ++k) {
      ws.push_back(w(n));
      uint64_t sum = 0;
      rs.push_back(rd(n, &sum));
      CHECK(sum == (n == records ? want_full : want_small),
            what + ": records read back differ from those written");
    }
    const double scale = static_cast<double>(records) / static_cast<double>(n);
    rows.push_back(
        {what, n, Median(ws) * scale, Median(rs) * scale, n != records});
    std::fprintf(stderr, "  %-36s write %.3f s  read %.3f s\n", what.c_str(),
                 rows.back().write_s, rows.back().read_s);
  };

  std::fprintf(stderr, "stream_seed_experiment: %" PRIu64 " records in %s\n",
               records, dir.c_str());
  run(
      "one syscall per field", syscall_records, 1,
      [&](uint64_t n) { return WriteSyscalls(file, n); },
      [&](uint64_t n, uint64_t* s) { return ReadSyscalls(file, n, s); });
  run(
      "BufferedWriter/BufferedReader", records, reps,
      [&](uint64_t n) { return WriteBuffered(file, n, **pool); },
      [&](uint64_t n, uint64_t* s) {
        return ReadBuffered(file, n, **pool, s);
      });
  run(
      "std::ofstream/std::ifstream", records, reps,
      [&](uint64_t n) { return WriteOfstream(file, n); },
      [&](uint64_t n, uint64_t* s) { return ReadIfstream(file, n, s); });
  run(
      "fwrite/fread", records, reps,
      [&](uint64_t n) { return WriteStdio(file, n); },
      [&](uint64_t n, uint64_t* s) { return ReadStdio(file, n, s); });
  unlink(file.c_str());

  // Big file, page cache warm (read once before timing).
  const std::string big = dir + "/big";
  const uint64_t big_bytes = big_mib << 20;
  MakeBigFile(big, big_bytes);
  ReadBigPlain(big, big_bytes);
  std::vector<double> t_buf, t_plain64, t_plain, t_dd;
  for (int k = 0; k < std::max(reps, 3); ++k) {
    t_buf.push_back(ReadBigBuffered(big, big_bytes, **pool));
    t_plain64.push_back(ReadBigPlain(big, big_bytes, 64 << 10));
    t_plain.push_back(ReadBigPlain(big, big_bytes));
    t_dd.push_back(ReadBigDd(big));
  }
  unlink(big.c_str());
  rmdir(dir.c_str());

  // ---- Report ----
  const Row& buffered = rows[1];
  std::string csv =
      "contender,records_measured,records,write_s,read_s,"
      "write_vs_buffered,read_vs_buffered,scaled\n";
  std::string big_csv = "reader,mib,seconds,gib_per_s,time_vs_dd\n";
  std::string json = "{\n  \"records\": " + std::to_string(records) +
                     ",\n  \"record_bytes\": 18,\n  \"streams\": [\n";
  std::printf("### Record streams: %" PRIu64
              " records (int32 + int64 + 6-byte string), field by field\n\n",
              records);
  std::printf(
      "| contender | write (s) | read (s) | write vs Buffered | read vs "
      "Buffered |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  char line[512];
  for (size_t k = 0; k < rows.size(); ++k) {
    const Row& r = rows[k];
    const double wr = r.write_s / buffered.write_s,
                 rr = r.read_s / buffered.read_s;
    std::printf("| %s%s | %.3f | %.3f | %.1f× | %.1f× |\n", r.what.c_str(),
                r.scaled ? " ¹" : "", r.write_s, r.read_s, wr, rr);
    std::snprintf(line, sizeof(line),
                  "\"%s\",%" PRIu64 ",%" PRIu64 ",%.6f,%.6f,%.3f,%.3f,%s\n",
                  r.what.c_str(), r.records, records, r.write_s, r.read_s, wr,
                  rr, r.scaled ? "yes" : "no");
    csv += line;
    std::snprintf(
        line, sizeof(line),
        "    {\"contender\": \"%s\", \"records_measured\": %" PRIu64
        ", \"write_s\": %.6f, \"read_s\": %.6f, \"write_vs_buffered\": "
        "%.3f, \"read_vs_buffered\": %.3f, \"scaled\": %s}%s\n",
        r.what.c_str(), r.records, r.write_s, r.read_s, wr, rr,
        r.scaled ? "true" : "false", k + 1 < rows.size() ? "," : "");
    json += line;
  }
  if (rows[0].scaled) {
    std::printf("\n¹ measured on %" PRIu64
                " records and scaled linearly to %" PRIu64 ".\n",
                rows[0].records, records);
  }
  std::printf(
      "\nTimes include open and close (no fsync); each is the median of "
      "%d runs (¹: one run). Every record read back is checked.\n",
      reps);

  const double mb = static_cast<double>(big_bytes) / (1 << 20);
  struct BigRow {
    const char* what;
    double s;
  } big_rows[] = {
      {"BufferedReader::Read, 64 KiB spans", Median(t_buf)},
      {"read(2), 64 KiB", Median(t_plain64)},
      {"read(2), 128 KiB", Median(t_plain)},
      {"dd bs=128k of=/dev/null", Median(t_dd)},
  };
  std::printf(
      "\n### Reading a %.0f MiB file (page cache warm), median of %zu\n\n", mb,
      t_buf.size());
  std::printf("| reader | time (s) | GiB/s | vs dd |\n|---|---:|---:|---:|\n");
  json += "  ],\n  \"big_read\": {\"mib\": " + std::to_string(big_mib) +
          ", \"readers\": [\n";
  for (size_t k = 0; k < 4; ++k) {
    const BigRow& b = big_rows[k];
    const double gibs = mb / 1024 / b.s, vs = b.s / big_rows[3].s;
    std::printf("| %s | %.3f | %.2f | %.2f× |\n", b.what, b.s, gibs, vs);
    std::snprintf(line, sizeof(line), "\"%s\",%" PRIu64 ",%.6f,%.3f,%.3f\n",
                  b.what, big_mib, b.s, gibs, vs);
    big_csv += line;
    std::snprintf(line, sizeof(line),
                  "    {\"reader\": \"%s\", \"seconds\": %.6f, \"gib_per_s\": "
                  "%.3f, \"vs_dd\": %.3f}%s\n",
                  b.what, b.s, gibs, vs, k + 1 < 4 ? "," : "");
    json += line;
  }
  json += "  ]}\n}\n";
  std::printf(
      "\n(\"vs\" columns: time divided by the reference's time; "
      "above 1 means slower.)\n");

  // The goals, judged from this run's numbers.
  const double vs_syscall = rows[0].write_s / buffered.write_s;
  const bool beats_std =
      buffered.write_s < rows[2].write_s && buffered.write_s < rows[3].write_s;
  const double vs_dd = big_rows[0].s / big_rows[3].s;
  auto verdict = [](bool ok) { return ok ? "met" : "NOT met"; };
  std::printf("\n### Goals\n\n");
  std::printf(
      "- buffered writing ≥ 100× faster than one call per field: "
      "%.0f× (%s)\n",
      vs_syscall, verdict(vs_syscall >= 100));
  std::printf(
      "- buffered writing faster than ofstream and fwrite: %.1f× and "
      "%.1f× faster (%s)\n",
      rows[2].write_s / buffered.write_s, rows[3].write_s / buffered.write_s,
      verdict(beats_std));
  std::printf(
      "- Read into 64 KiB spans at least as fast as dd bs=128k: "
      "%.2f× dd's time (%s)\n",
      vs_dd, verdict(vs_dd <= 1.0));
  std::fflush(stdout);

  for (const auto& [name, text] :
       {std::pair<std::string, std::string>{"stream_records.csv", csv},
        {"stream_big_read.csv", big_csv},
        {"stream_bench.json", json}}) {
    std::ofstream f(out_dir + "/" + name);
    f << text;
    CHECK(f.good(), "cannot write " + out_dir + "/" + name);
  }
  return 0;
}
