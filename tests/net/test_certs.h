// Throwaway certificate authorities and gateway certificates for link tests, made at run time
// with the openssl command-line tool in a private temporary directory.
#ifndef STRAIT_TESTS_NET_TEST_CERTS_H_
#define STRAIT_TESTS_NET_TEST_CERTS_H_

#include <string>

#include "strait/status.h"

namespace strait::net::testing {

struct CertFiles {
  std::string ca;    // the CA that signed `cert`
  std::string cert;
  std::string key;
};

class TestPki {
 public:
  // Creates a fresh temporary directory; removed by the destructor.
  static StatusOr<TestPki> Create();
  TestPki(TestPki&&) noexcept;
  ~TestPki();

  // Makes a CA named `name` (idempotent).
  Status MakeCa(const std::string& name);
  // Makes a gateway certificate for `region`, signed by CA `ca`, with SAN URI
  // strait://region/<region>; `file_stem` names the files (several certificates may claim one
  // region).
  StatusOr<CertFiles> MakeGateway(const std::string& ca, const std::string& region,
                                  const std::string& file_stem);

 private:
  explicit TestPki(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace strait::net::testing

#endif  // STRAIT_TESTS_NET_TEST_CERTS_H_
