// Throwaway PKI for the link tests (see test_certs.h).
#include "tests/net/test_certs.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace strait::net::testing {
namespace {

Status Sh(const std::string& command) {
  const std::string full = command + " >/dev/null 2>&1";
  if (std::system(full.c_str()) != 0) return InternalError("command failed: " + command);
  return Status::Ok();
}

}  // namespace

StatusOr<TestPki> TestPki::Create() {
  std::string templ = (std::filesystem::temp_directory_path() / "strait-pki-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) return InternalError("mkdtemp failed");
  return TestPki(templ);
}

TestPki::TestPki(TestPki&& other) noexcept : dir_(std::move(other.dir_)) { other.dir_.clear(); }

TestPki::~TestPki() {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Status TestPki::MakeCa(const std::string& name) {
  const std::string base = dir_ + "/" + name;
  if (std::filesystem::exists(base + ".pem")) return Status::Ok();
  return Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
            base + ".key -out " + base + ".pem -days 2 -subj /CN=" + name);
}

StatusOr<CertFiles> TestPki::MakeGateway(const std::string& ca, const std::string& region,
                                         const std::string& file_stem) {
  const std::string base = dir_ + "/" + file_stem;
  const std::string ca_base = dir_ + "/" + ca;
  {
    std::ofstream ext(base + ".ext");
    ext << "subjectAltName=URI:strait://region/" << region << "\n"
        << "basicConstraints=CA:FALSE\n"
        << "keyUsage=digitalSignature\n"
        << "extendedKeyUsage=serverAuth,clientAuth\n";
  }
  STRAIT_RETURN_IF_ERROR(Sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                            "-nodes -keyout " + base + ".key -out " + base + ".csr -subj /CN=" +
                            file_stem));
  STRAIT_RETURN_IF_ERROR(Sh("openssl x509 -req -in " + base + ".csr -CA " + ca_base +
                            ".pem -CAkey " + ca_base + ".key -set_serial " +
                            std::to_string(std::rand() % 1000000 + 1) + " -days 2 -out " + base +
                            ".pem -extfile " + base + ".ext"));
  return CertFiles{ca_base + ".pem", base + ".pem", base + ".key"};
}

}  // namespace strait::net::testing
