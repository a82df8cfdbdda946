#include "plugins/errors.h"

namespace maxdev::plugins {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::not_found: return "not_found";
    case ErrorKind::bad_image: return "bad_image";
    case ErrorKind::abi_mismatch: return "abi_mismatch";
    case ErrorKind::manifest: return "manifest";
    case ErrorKind::schema: return "schema";
    case ErrorKind::state: return "state";
    case ErrorKind::untrusted: return "untrusted";
    case ErrorKind::hash_mismatch: return "hash_mismatch";
    case ErrorKind::busy: return "busy";
    case ErrorKind::snapshot: return "snapshot";
  }
  return "unknown";
}

}  // namespace maxdev::plugins
