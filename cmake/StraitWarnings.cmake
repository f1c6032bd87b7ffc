# strait_module(): the house rules every Strait target gets (warnings, -Werror=unused-result so
# an ignored Status fails the build, no FMA contraction so vector and scalar arithmetic agree).
function(strait_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Werror=unused-result -Werror=return-type -ffp-contract=off>)
  if(STRAIT_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
    # gcc 12 at -O3 reports -Wrestrict and -Warray-bounds inside libstdc++'s std::string on
    # plain concatenations ("\"" + s + "\"") that cannot overlap (GCC bugs 105329 and 105651);
    # a dozen files hit it in Release. They stay warnings there, not errors.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
       AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=restrict -Wno-error=array-bounds>)
    endif()
  endif()
endfunction()

# strait_module(NAME <name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Creates the static library strait_<name>, aliased strait::<name>, exported for install.
function(strait_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(t strait_${M_NAME})
  add_library(${t} STATIC ${M_SOURCES})
  add_library(strait::${M_NAME} ALIAS ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${M_NAME} OUTPUT_NAME strait_${M_NAME})
  target_include_directories(${t}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/lib>)
  target_link_libraries(${t} PUBLIC ${M_PUBLIC_DEPS} PRIVATE ${M_PRIVATE_DEPS})
  strait_target_defaults(${t})
  install(TARGETS ${t} EXPORT StraitTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
