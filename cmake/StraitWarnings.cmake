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

# strait_module_include_root(<target> <module> <PUBLIC|PRIVATE|INTERFACE>)
# Gives <target> the include root of lib/<module> alone: a directory in the build tree holding one
# symbolic link, <module> -> lib/<module>, so that "<module>/foo.h" resolves and no other module's
# headers do. A module's root is PUBLIC on its target, so a target sees exactly the roots of the
# modules it links directly or through PUBLIC dependencies; an include of a module above it (or
# beside it, not linked) fails to compile (tests/build/check_layering.sh proves it).
function(strait_module_include_root target module visibility)
  set(root ${PROJECT_BINARY_DIR}/include-roots/${module})
  if(NOT IS_SYMLINK ${root}/${module})
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/lib/${module} ${root}/${module} SYMBOLIC)
  endif()
  target_include_directories(${target} ${visibility} $<BUILD_INTERFACE:${root}>)
endfunction()

# strait_module(NAME <name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Creates the static library strait_<name>, aliased strait::<name>, exported for install. Its
# include root (strait_module_include_root) is PUBLIC; a dependency whose headers this module's
# headers include must be a PUBLIC_DEP, one used only by its sources a PRIVATE_DEP.
function(strait_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(t strait_${M_NAME})
  add_library(${t} STATIC ${M_SOURCES})
  add_library(strait::${M_NAME} ALIAS ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${M_NAME} OUTPUT_NAME strait_${M_NAME})
  target_include_directories(${t}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  strait_module_include_root(${t} ${M_NAME} PUBLIC)
  target_link_libraries(${t} PUBLIC ${M_PUBLIC_DEPS} PRIVATE ${M_PRIVATE_DEPS})
  strait_target_defaults(${t})
  install(TARGETS ${t} EXPORT StraitTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
