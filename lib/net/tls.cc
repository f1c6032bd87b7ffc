// TLS contexts and certificate identities for WAN streams (see tls.h).
#include "net/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstdio>

#include "common/system_error.h"
#include "net/link.h"
#include "net/wire.h"

namespace strait::net {
namespace {

// Empties OpenSSL's error queue into one line. `sys_errno`: the errno of the first error that
// came from a system call (ERR_LIB_SYS keeps it as the reason), or 0.
std::string OpenSslErrors(int* sys_errno = nullptr) {
  std::string out;
  if (sys_errno != nullptr) *sys_errno = 0;
  while (unsigned long e = ERR_get_error()) {
    if (sys_errno != nullptr && *sys_errno == 0 && ERR_GET_LIB(e) == ERR_LIB_SYS) {
      *sys_errno = ERR_GET_REASON(e);
    }
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

void Blame(EndpointSetting* setting, EndpointSetting which) {
  if (setting != nullptr) *setting = which;
}

// A file that could not be loaded: the setting `which` is to blame, unless the process ran out
// of descriptors (the file is fine then, nothing is blamed, and the fix is the limit).
Status CannotLoad(const std::string& what, EndpointSetting* setting, EndpointSetting which) {
  int err = 0;
  std::string errors = OpenSslErrors(&err);
  if (IsDescriptorLimit(err)) return ErrnoStatus(what, err);
  Blame(setting, which);
  return InvalidArgumentError(what + ": " + errors);
}

}  // namespace

StatusOr<std::unique_ptr<asio::ssl::context>> MakeTlsContext(const std::string& ca_file,
                                                            const std::string& cert_file,
                                                            const std::string& key_file,
                                                            EndpointSetting* setting) {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX* native = ctx->native_handle();
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION) != 1) {
    return InternalError("cannot require TLS 1.3: " + OpenSslErrors());
  }
  if (SSL_CTX_load_verify_locations(native, ca_file.c_str(), nullptr) != 1) {
    return CannotLoad("cannot load the cluster CA from '" + ca_file + "'", setting,
                      EndpointSetting::kCaFile);
  }
  if (SSL_CTX_use_certificate_chain_file(native, cert_file.c_str()) != 1) {
    return CannotLoad("cannot load the certificate chain '" + cert_file + "'", setting,
                      EndpointSetting::kCertFile);
  }
  if (SSL_CTX_use_PrivateKey_file(native, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    // OpenSSL 3 checks the pair while loading the key: a readable key of another certificate
    // fails here, not in SSL_CTX_check_private_key below.
    const int reason = ERR_GET_REASON(ERR_peek_last_error());
    if (reason == X509_R_KEY_VALUES_MISMATCH || reason == X509_R_KEY_TYPE_MISMATCH) {
      Blame(setting, EndpointSetting::kKeyMismatch);
      return InvalidArgumentError("private key '" + key_file + "' does not match certificate '" +
                                  cert_file + "': " + OpenSslErrors());
    }
    return CannotLoad("cannot load the private key '" + key_file + "'", setting,
                      EndpointSetting::kKeyFile);
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    Blame(setting, EndpointSetting::kKeyMismatch);
    return InvalidArgumentError("private key '" + key_file + "' does not match certificate '" +
                                cert_file + "'");
  }
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

std::vector<std::string> RegionsOfCertificate(X509* cert) {
  std::vector<std::string> regions;
  if (cert == nullptr) return regions;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return regions;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    std::string_view text(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                          static_cast<size_t>(ASN1_STRING_length(uri)));
    if (text.substr(0, kRegionUriPrefix.size()) != kRegionUriPrefix) continue;
    regions.emplace_back(text.substr(kRegionUriPrefix.size()));
  }
  GENERAL_NAMES_free(names);
  return regions;
}

StatusOr<std::string> PeerRegion(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return PermissionDeniedError("peer presented no certificate");
  std::vector<std::string> regions = RegionsOfCertificate(cert);
  X509_free(cert);
  if (regions.size() != 1) {
    return PermissionDeniedError("peer certificate names " + std::to_string(regions.size()) +
                                 " regions (SAN URI strait://region/<name>); exactly one needed");
  }
  if (!IsValidRegionName(regions[0])) {
    return PermissionDeniedError("peer certificate names an invalid region '" + regions[0] + "'");
  }
  return regions[0];
}

Status CheckOwnCertificateVerifies(const std::string& ca_file, const std::string& cert_file,
                                   const std::string& key_file) {
  STRAIT_ASSIGN_OR_RETURN(std::unique_ptr<asio::ssl::context> ctx,
                          MakeTlsContext(ca_file, cert_file, key_file, nullptr));
  SSL_CTX* native = ctx->native_handle();
  X509_STORE_CTX* verify = X509_STORE_CTX_new();
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(native, &chain);
  if (verify == nullptr ||
      X509_STORE_CTX_init(verify, SSL_CTX_get_cert_store(native), SSL_CTX_get0_certificate(native),
                          chain) != 1) {
    X509_STORE_CTX_free(verify);
    return InternalError("cannot verify the certificate chain '" + cert_file +
                         "': " + OpenSslErrors());
  }
  const int error = X509_verify_cert(verify) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(verify);
  X509_STORE_CTX_free(verify);
  ERR_clear_error();
  if (error == X509_V_OK) return Status::Ok();
  return InvalidArgumentError("certificate '" + cert_file +
                              "' does not verify against the cluster CA '" + ca_file + "': " +
                              X509_verify_cert_error_string(error) +
                              " (every peer would refuse it)");
}

StatusOr<std::string> RegionOfCertificateFile(const std::string& cert_file) {
  FILE* f = std::fopen(cert_file.c_str(), "r");
  if (f == nullptr) {
    const int err = errno;
    return ErrnoStatus("cannot open certificate '" + cert_file + "'", err,
                       StatusCode::kInvalidArgument);
  }
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (cert == nullptr) return InvalidArgumentError("'" + cert_file + "' holds no PEM certificate");
  std::vector<std::string> regions = RegionsOfCertificate(cert);
  X509_free(cert);
  if (regions.size() != 1) {
    return InvalidArgumentError("certificate '" + cert_file + "' names " +
                                std::to_string(regions.size()) +
                                " regions (SAN URI strait://region/<name>); exactly one needed");
  }
  return regions[0];
}

StatusOr<std::unique_ptr<asio::ssl::context>> LoadTlsIdentity(const std::string& region,
                                                              const std::string& ca_file,
                                                              const std::string& cert_file,
                                                              const std::string& key_file,
                                                              EndpointSetting* setting) {
  STRAIT_ASSIGN_OR_RETURN(std::unique_ptr<asio::ssl::context> ctx,
                          MakeTlsContext(ca_file, cert_file, key_file, setting));
  StatusOr<std::string> own = RegionOfCertificateFile(cert_file);
  if (!own.ok() || *own != region) Blame(setting, EndpointSetting::kCertRegion);
  if (!own.ok()) return own.status();
  if (*own != region) {
    return InvalidArgumentError("certificate '" + cert_file + "' names region '" + *own +
                                "' but this endpoint is configured as '" + region + "'");
  }
  return ctx;
}

}  // namespace strait::net
