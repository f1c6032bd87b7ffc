// TLS 1.3 with mutual authentication for WAN streams, and the identity rule: a gateway's
// certificate chains to the cluster CA and names its region in a SAN URI
// "strait://region/<name>". Internal to lib/net (exposes Asio types).
#ifndef STRAIT_LIB_NET_TLS_H_
#define STRAIT_LIB_NET_TLS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <asio/ssl.hpp>

#include "strait/status.h"

namespace strait::net {

inline constexpr std::string_view kRegionUriPrefix = "strait://region/";

enum class EndpointSetting : int;  // net/link.h: which option a failed check is about

// A context for both roles (client and server): TLS 1.3 only, our chain and key, peers verified
// against `ca_file` and required to present a certificate. Fails with a message naming the file;
// `setting` (if not null) is then set to the file at fault (kCaFile, kCertFile, kKeyFile,
// kKeyMismatch).
StatusOr<std::unique_ptr<asio::ssl::context>> MakeTlsContext(const std::string& ca_file,
                                                            const std::string& cert_file,
                                                            const std::string& key_file,
                                                            EndpointSetting* setting = nullptr);

// MakeTlsContext plus the identity check: the certificate must name exactly `region`. What an
// endpoint loads at start and again on ReloadIdentity (certificate rotation); errors name the
// file at fault (and so does `setting`, if not null: kCertRegion for a certificate of another
// region), and nothing is half-loaded (the caller keeps its old context on error).
StatusOr<std::unique_ptr<asio::ssl::context>> LoadTlsIdentity(const std::string& region,
                                                              const std::string& ca_file,
                                                              const std::string& cert_file,
                                                              const std::string& key_file,
                                                              EndpointSetting* setting = nullptr);

// The regions named by SAN URIs of the form strait://region/<name> in `cert` (usually one).
std::vector<std::string> RegionsOfCertificate(X509* cert);

// The single region of the peer of a completed handshake, or an error saying why there is none.
StatusOr<std::string> PeerRegion(SSL* ssl);

// The region our own certificate file names (for checking the configuration at start).
StatusOr<std::string> RegionOfCertificateFile(const std::string& cert_file);

// Whether this gateway's own certificate chain verifies against `ca_file`, as its peers, which
// trust the same CA, will verify it (issuer, signature, validity dates). MakeTlsContext does not
// ask this, so that tests can play a gateway certified by another CA; the gateway's config check
// does, so that an operator learns it before every peer refuses the gateway.
Status CheckOwnCertificateVerifies(const std::string& ca_file, const std::string& cert_file,
                                   const std::string& key_file);

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_TLS_H_
