// CheckConfigEnvironment (see config_check.h): net::CheckEndpoint on the gateway's endpoint
// options, its failures named by config key with the fix, that the gateway's own certificate
// verifies against its CA, and the key file's mode.
#include "gateway/config_check.h"

#include <sys/stat.h>

#include <cstdio>

#include "net/tls.h"

namespace strait::gateway {
namespace {

// The config key an endpoint setting comes from, and how an operator fixes it.
struct Blame {
  const char* key;
  std::string fix;
};

Blame BlameFor(net::EndpointSetting setting, const GatewayConfig& c) {
  switch (setting) {
    case net::EndpointSetting::kCongestionControl:
      return {"link.congestion_control",
              "choose an algorithm the kernel offers, or load its module (e.g. `modprobe "
              "tcp_bbr`)"};
    case net::EndpointSetting::kCaFile:
      return {"tls.ca",
              "point tls.ca at the cluster CA certificate (PEM) that signed every gateway's "
              "certificate (`strait-certs show`), readable by straitd's user"};
    case net::EndpointSetting::kCertFile:
      return {"tls.cert",
              "point tls.cert at this gateway's certificate (PEM) from `strait-certs gateway`, "
              "readable by straitd's user"};
    case net::EndpointSetting::kCertRegion:
      return {"tls.cert", "install a certificate issued for region '" + c.region +
                              "' (`strait-certs gateway --region " + c.region +
                              "`), or correct `region` if it is this gateway's that is wrong"};
    case net::EndpointSetting::kKeyFile:
      return {"tls.key",
              "point tls.key at this gateway's private key (PEM), readable by straitd's user"};
    case net::EndpointSetting::kKeyMismatch:
      return {"tls.key",
              "point tls.key at the key tls.cert was issued for (copy the matching pair from "
              "`strait-certs`), or reissue both"};
    case net::EndpointSetting::kOptions:
    case net::EndpointSetting::kNone:
      break;
  }
  return {"link", "correct the [link] settings the message names (deploy/CONFIG.md lists them)"};
}

}  // namespace

net::EndpointOptions EndpointOptionsOf(const GatewayConfig& config) {
  net::EndpointOptions o;
  o.region = config.region;
  o.transport = config.transport;
  o.ca_file = config.tls_ca;
  o.cert_file = config.tls_cert;
  o.key_file = config.tls_key;
  for (const auto& [region, shards] : config.peers) o.peer_regions.push_back(region);
  if (!config.region_gateways.empty()) o.peer_regions.push_back(config.region);
  o.link = config.link;
  return o;
}

Status CheckConfigEnvironment(const GatewayConfig& config, std::vector<std::string>* warnings) {
  net::EndpointSetting setting = net::EndpointSetting::kNone;
  if (Status s = net::CheckEndpoint(EndpointOptionsOf(config), &setting); !s.ok()) {
    // Out of descriptors: no setting is wrong, and the message already says what to raise.
    if (s.code() == StatusCode::kResourceExhausted) return s.WithContext(config.file);
    const Blame blame = BlameFor(setting, config);
    return InvalidArgumentError(config.file + ": " + blame.key + ": " + std::string(s.message()) +
                                "; fix: " + blame.fix);
  }
  if (config.transport != net::Transport::kTls) return Status::Ok();
  if (Status s = net::CheckOwnCertificateVerifies(config.tls_ca, config.tls_cert, config.tls_key);
      !s.ok()) {
    return InvalidArgumentError(config.file + ": tls.cert: " + std::string(s.message()) +
                                "; fix: issue it from that CA (`strait-certs gateway`), or point "
                                "tls.ca at the CA that signed it");
  }
  // The key loaded, so it exists. Any access for others leaks the gateway's identity to every
  // local account; group read stays allowed, because that is how the documented setups let
  // straitd read a key it does not own (0640 root:strait; Kubernetes' defaultMode 0440 with
  // fsGroup), but group write or execute is not.
  struct stat st {};
  if (::stat(config.tls_key.c_str(), &st) == 0 &&
      (st.st_mode & (S_IRWXO | S_IWGRP | S_IXGRP)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    if (warnings != nullptr) {
      warnings->push_back(config.file + ": tls.key: private key '" + config.tls_key +
                          "' is readable or writable by others (mode " + mode +
                          "); fix: `chmod 600 " + config.tls_key +
                          "` if straitd's user owns it, or `chmod 640` with group strait");
    }
  }
  return Status::Ok();
}

}  // namespace strait::gateway
