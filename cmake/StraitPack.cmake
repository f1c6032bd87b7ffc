# Installing the operator's files and packaging: `cmake --install` puts, under the prefix,
#   bin/straitd, bin/strait-bench, bin/strait-wanem, bin/strait-certs
#   lib/systemd/system/straitd.service, lib/sysusers.d/straitd.conf
#   etc/default/straitd (/etc/default/straitd for prefix /usr: a conffile of the .deb)
#   share/strait/examples/straitd.toml, share/strait/kubernetes/*.yaml
#   share/strait/prometheus/strait-rules.yml (alerting rules), share/strait/grafana/strait.json
#   share/man/man1/strait-bench.1.gz, strait-certs.1.gz, share/man/man8/straitd.8.gz,
#   strait-wanem.8.gz (docs/man, compressed as Debian wants them)
#   share/doc/strait/README.md, CHANGELOG.md, CONFIG.md, copyright (Apache-2.0, Debian's
#   machine-readable form)
#   lib/python3/dist-packages/strait/ (the Python package, python/strait: Debian's python3 path)
# besides the headers, the CMake package and the NCCL plugin that their own directories install.
# `cpack -G DEB` then makes strait_<version>_<arch>.deb from the same rules (prefix /usr);
# its library dependencies come from dpkg-shlibdeps.
include_guard(GLOBAL)

set(STRAIT_DEPLOY_DIR ${PROJECT_SOURCE_DIR}/deploy)

# The unit names /usr/bin/straitd and /etc/default/straitd (right for the .deb); other prefixes
# get their own paths, substituted when the install runs, because CPack installs with its own
# prefix (/usr). The configuration directory follows the prefix as GNUInstallDirs' SYSCONFDIR
# would: /etc for a prefix that ends in /usr (/usr/../etc), <prefix>/etc otherwise; the rules
# below reuse `strait_etc` (install scripts run in one scope, in order).
set(STRAIT_UNIT_OUT ${PROJECT_BINARY_DIR}/deploy/straitd.service)
install(CODE "
  if(CMAKE_INSTALL_PREFIX MATCHES \"/usr/?$\")
    set(strait_etc \"\${CMAKE_INSTALL_PREFIX}/../etc\")
  else()
    set(strait_etc \"\${CMAKE_INSTALL_PREFIX}/etc\")
  endif()
  cmake_path(NORMAL_PATH strait_etc)
  string(REGEX REPLACE \"/$\" \"\" strait_etc \"\${strait_etc}\")
  file(READ \"${STRAIT_DEPLOY_DIR}/systemd/straitd.service\" unit)
  string(REPLACE \"/usr/bin/straitd\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/straitd\"
         unit \"\${unit}\")
  string(REPLACE \"/etc/default/straitd\" \"\${strait_etc}/default/straitd\" unit \"\${unit}\")
  file(WRITE \"${STRAIT_UNIT_OUT}\" \"\${unit}\")
")
install(FILES ${STRAIT_UNIT_OUT} DESTINATION lib/systemd/system)
install(FILES ${STRAIT_DEPLOY_DIR}/systemd/straitd.sysusers DESTINATION lib/sysusers.d
        RENAME straitd.conf)
# The unit's environment file, /etc/default/straitd: a conffile of the .deb, so that dpkg keeps
# an operator's edits across upgrades and asks before replacing them (a postinst copy, as
# before, left it unowned: never updated, never removed on purge; deploy/debian/preinst moves
# such a copy out of the way). In `strait_etc`/default (the unit's rule above).
install(CODE "
  file(INSTALL DESTINATION \"\${strait_etc}/default\" TYPE FILE
       RENAME straitd FILES \"${STRAIT_DEPLOY_DIR}/systemd/straitd.env\")
")
install(FILES ${STRAIT_DEPLOY_DIR}/examples/straitd.toml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/strait/examples)
install(DIRECTORY ${STRAIT_DEPLOY_DIR}/kubernetes/ DESTINATION ${CMAKE_INSTALL_DATADIR}/strait/kubernetes)
install(FILES ${STRAIT_DEPLOY_DIR}/prometheus/strait-rules.yml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/strait/prometheus)
install(FILES ${STRAIT_DEPLOY_DIR}/grafana/strait.json
        DESTINATION ${CMAKE_INSTALL_DATADIR}/strait/grafana)
# With the project version filled in (strait-certs --version, as every Strait tool).
configure_file(${STRAIT_DEPLOY_DIR}/certs/strait-certs.sh ${PROJECT_BINARY_DIR}/strait-certs
               @ONLY)
install(PROGRAMS ${PROJECT_BINARY_DIR}/strait-certs DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
              ${STRAIT_DEPLOY_DIR}/CONFIG.md
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/strait)
# Man pages (written by hand in docs/man; tests/deploy/check_man.py holds them to each tool's
# --help), gzip -9n'd at build time: Debian's policy wants them compressed, reproducibly.
set(STRAIT_MAN_PAGES straitd.8 strait-wanem.8 strait-bench.1 strait-certs.1)
find_program(STRAIT_GZIP gzip)
set(strait_man_outputs)
foreach(page IN LISTS STRAIT_MAN_PAGES)
  string(REGEX MATCH "[1-8]$" section ${page})
  set(src ${PROJECT_SOURCE_DIR}/docs/man/${page})
  if(STRAIT_GZIP)
    set(out ${PROJECT_BINARY_DIR}/man/${page}.gz)
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND ${STRAIT_GZIP} -9nc ${src} > ${out}
      DEPENDS ${src} VERBATIM)
    list(APPEND strait_man_outputs ${out})
  else()
    set(out ${src})
  endif()
  install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
endforeach()
add_custom_target(strait_man_pages ALL DEPENDS ${strait_man_outputs})
# Debian's files for lintian: the changelog a native package carries (changelog.gz, the version
# filled in), and the overrides of the tags the one-package layout earns on purpose
# (deploy/debian/lintian-overrides says why for each).
configure_file(${STRAIT_DEPLOY_DIR}/debian/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog
               @ONLY)
if(STRAIT_GZIP)
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/debian/changelog.gz
    COMMAND ${STRAIT_GZIP} -9nc ${PROJECT_BINARY_DIR}/debian/changelog
            > ${PROJECT_BINARY_DIR}/debian/changelog.gz
    DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog VERBATIM)
  add_custom_target(strait_debian_changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog.gz)
  install(FILES ${PROJECT_BINARY_DIR}/debian/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/strait)
endif()
install(FILES ${STRAIT_DEPLOY_DIR}/debian/lintian-overrides
        DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides RENAME strait)
# The licence, as Debian wants it: a machine-readable copyright file that points at
# /usr/share/common-licenses/Apache-2.0 (the full text is LICENSE at the top of the source tree).
install(FILES ${STRAIT_DEPLOY_DIR}/debian/copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/strait)
# The Python package (pure Python; it dlopens libstrait.so.0 from the loader's path, which the
# postinst's ldconfig makes current).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/strait/ DESTINATION lib/python3/dist-packages/strait
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# --- CPack: one .deb with everything above ----------------------------------------------------
set(CPACK_PACKAGE_NAME strait)
set(CPACK_PACKAGE_VENDOR "Strait")
set(CPACK_PACKAGE_CONTACT "Strait maintainers <strait-maintainers@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Cross-region communication for NCCL: straitd gateway, NCCL net plugin, tools")
# Lines under 80 columns: CPack indents each for the control file (lintian checks the width).
set(CPACK_PACKAGE_DESCRIPTION
    "Strait carries the cross-region traffic of NCCL training jobs through region
gateways (straitd) over compressed, striped, mutually authenticated TLS links.
This package holds straitd with its systemd unit, the NCCL net plugin
libnccl-net-strait.so, the C library libstrait and its Python package,
strait-bench, strait-wanem, strait-certs, the C/C++ headers and the CMake
package.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # strait_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Besides the libraries: strait-certs runs openssl; the maintainer scripts need passwd (useradd);
# the Python package (/usr/lib/python3/dist-packages/strait) needs an interpreter.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "openssl, passwd, python3:any")
# The shlibs file for libstrait.so.0 (dpkg-shlibdeps of packages built against it), and stripped
# binaries and libraries, as Debian's policy (and lintian) want.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${STRAIT_DEPLOY_DIR}/debian/preinst ${STRAIT_DEPLOY_DIR}/debian/postinst
    ${STRAIT_DEPLOY_DIR}/debian/prerm
    ${STRAIT_DEPLOY_DIR}/debian/postrm ${STRAIT_DEPLOY_DIR}/debian/triggers
    ${STRAIT_DEPLOY_DIR}/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
