// Compiles the one header named by STRAIT_LAYERING_HEADER with the include roots of the module
// that its target links (tests/build/CMakeLists.txt): check_layering.sh expects an include of a
// module above (or beside) that one to fail, and one of the module itself or its dependencies to
// compile.
#include STRAIT_LAYERING_HEADER
