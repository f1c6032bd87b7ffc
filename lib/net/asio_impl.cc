// The one translation unit that compiles Asio (ASIO_SEPARATE_COMPILATION), TLS included.
#include <asio/impl/src.hpp>
#include <asio/ssl/impl/src.hpp>
