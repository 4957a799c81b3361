/* Uses the installed C API the way docs/c_api.md describes, from C. */
#include <stdio.h>
#include <string.h>

#include "bufpool/c.h"

int main(void) {
  bufpool_options opts = BUFPOOL_OPTIONS_INIT;
  opts.buffer_count = 16;
  char* err = NULL;
  bufpool_pool* pool = bufpool_create(&opts, &err);
  if (pool == NULL) {
    fprintf(stderr, "%s\n", err);
    bufpool_free_error(err);
    return 1;
  }
  void* b = bufpool_try_acquire(pool);
  void* w = bufpool_acquire(pool, 5000000 /* ns */, &err);
  if (b == NULL || w == NULL || bufpool_buffer_size(pool) != 4096) return 1;
  memset(b, 0x5a, 4096);
  bufpool_release(pool, b);
  bufpool_release(pool, w);
  void* ptrs[32];
  size_t n = bufpool_try_acquire_bulk(pool, ptrs, 32);
  if (n != 16) return 1;
  bufpool_release_bulk(pool, ptrs, n);
  bufpool_stats st;
  bufpool_get_stats(pool, &st);
  void* base;
  size_t len;
  bufpool_region(pool, &base, &len);
  if (st.in_use != 0 || st.high_water != 16 || len != 16 * 4096) return 1;
  bufpool_destroy(pool);
  puts("c consumer ok");
  return 0;
}
