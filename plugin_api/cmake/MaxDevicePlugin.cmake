# max_device_add_plugin(<target> SOURCES <src>... [VERSION_SCRIPT auto|<file>])
#
# Builds a max_device kernel plugin: a MODULE library lib<target>.so that
# exports exactly one symbol, maxdev_plugin_entry, and depends on nothing from
# PyTorch. This one file serves the in-tree build (plugin_api/CMakeLists.txt
# includes it) and the installed package (find_package(MaxDevicePlugin)).
#
# What every plugin gets, and why (see plugin_api/README.md, "Build rules"):
#   -fvisibility=hidden, -fvisibility-inlines-hidden
#       nothing but the entry point is visible, so two loaded versions of a
#       plugin can never bind to each other's helpers;
#   a linker version script { global: maxdev_plugin_entry; local: *; }
#       one exported symbol, whatever the sources declare;
#   -fno-gnu-unique (GCC)
#       GNU unique symbols (static locals of inline functions, template
#       statics) pin a library in memory: dlclose becomes a silent no-op and
#       a rebuilt plugin could never replace the old one;
#   -Wl,-z,defs
#       every symbol is resolved at link time against the plugin's own
#       dependencies; a plugin cannot lean on symbols of the host (libtorch);
#   -Wall -Wextra, and max_device::plugin_api for the headers.
#
# VERSION_SCRIPT auto (the default) generates the script in the build tree;
# VERSION_SCRIPT <file> uses your own (it must still export only
# maxdev_plugin_entry for the loader's checks to pass).
#
# Link extra libraries as usual afterwards, e.g.
#   target_link_libraries(<target> PRIVATE m)

include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS 3.18)
  message(FATAL_ERROR "max_device_add_plugin needs CMake >= 3.18")
endif()

function(max_device_add_plugin target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "VERSION_SCRIPT" "SOURCES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR
      "max_device_add_plugin(${target}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "max_device_add_plugin(${target}): SOURCES is required")
  endif()
  if(NOT TARGET max_device::plugin_api)
    message(FATAL_ERROR
      "max_device_add_plugin(${target}): target max_device::plugin_api is missing; "
      "use find_package(MaxDevicePlugin) or add plugin_api/ to the build first")
  endif()
  if(NOT arg_VERSION_SCRIPT)
    set(arg_VERSION_SCRIPT auto)
  endif()

  if(arg_VERSION_SCRIPT STREQUAL "auto")
    set(map "${CMAKE_CURRENT_BINARY_DIR}/${target}.maxdev.map")
    file(CONFIGURE OUTPUT "${map}"
      CONTENT "{\n  global: maxdev_plugin_entry;\n  local: *;\n};\n")
  else()
    get_filename_component(map "${arg_VERSION_SCRIPT}" ABSOLUTE
      BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${map}")
      message(FATAL_ERROR
        "max_device_add_plugin(${target}): VERSION_SCRIPT ${map} does not exist")
    endif()
  endif()

  add_library(${target} MODULE ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE max_device::plugin_api)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    POSITION_INDEPENDENT_CODE ON
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS "${map}")
  # The visibility presets above add -fvisibility=hidden (C and C++) and
  # -fvisibility-inlines-hidden (C++).
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-fno-gnu-unique>
    -Wall -Wextra)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${map}"
    "LINKER:-z,defs")
endfunction()
