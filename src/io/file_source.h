// What the local-file sources share (source.cc, direct_source.cc): making the Source of a backend from an open
// descriptor, for open_file_source() and for Source::reopen().
#ifndef SAFETENSORS_SRC_IO_FILE_SOURCE_H_
#define SAFETENSORS_SRC_IO_FILE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "safetensors/error.h"
#include "safetensors/source.h"

namespace safetensors::internal {

// The Source that reads the regular file open as `fd` (which it takes over, also on failure) through `backend`,
// `size` bytes long. Errors: none today (a Result for the factories that may fail).
Result<std::shared_ptr<const Source>> file_source_for(std::string path, int fd, std::uint64_t size, Backend backend);

// Source::reopen() of a local file open as `fd` (which stays the caller's): file_source_for a second descriptor
// of the same file (reopen_descriptor). Errors: kIo (the file could not be opened again).
Result<std::shared_ptr<const Source>> reopen_file_source(int fd, const std::string& path, std::uint64_t size,
                                                         Backend backend);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_IO_FILE_SOURCE_H_
