// What the C API's files share (src/c): errors as C strings, and text
// copied out as snprintf() does. Private; not installed.
#ifndef BUFPOOL_SRC_C_C_INTERNAL_H_
#define BUFPOOL_SRC_C_C_INTERNAL_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace bufpool::c_internal {

// Stored in *err when even the message cannot be allocated;
// bufpool_free_error() does not free it.
extern char kNoMemoryError[];

// LevelDB's convention (see bufpool/c.h): when err is not NULL, frees what
// *err held with bufpool_free_error(), then stores a malloc()ed copy of the
// message (the status as Status::ToString() writes it).
void StoreError(char** err, std::string_view message);
void StoreError(char** err, const absl::Status& status);

// snprintf()'s contract: at most size - 1 bytes of text and a NUL into buf
// (untouched when size is 0); returns text.size().
size_t CopyOut(std::string_view text, char* buf, size_t size);

}  // namespace bufpool::c_internal

#endif  // BUFPOOL_SRC_C_C_INTERNAL_H_
