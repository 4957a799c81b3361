// The layering test's planted defect: checked as if it were
// src/arena/bad_include.cc, where including the copy engine's private header
// breaks the rooms' order; cmake/layering.cmake must report it.
#include "copy/copy_internal.h"
