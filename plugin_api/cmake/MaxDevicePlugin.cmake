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

# max_device_add_plugin_wheel(<target> VERSION <version> [NAME <name>]
#                             [PACKAGE <package>] [OUTPUT_DIRECTORY <dir>])
#
# Packages the plugin <target> (made by max_device_add_plugin) as a Python
# wheel whenever it is rebuilt: target <target>_wheel, part of the default
# build. Installed with pip, the wheel declares the entry point
# `<name> = <package>:lib<target>.so` in the group max_device.plugins, so
# max_device.load_plugin("<name>") finds it and max_device.available_plugins()
# lists it. NAME defaults to <target>, PACKAGE to max_device_plugin_<name>,
# OUTPUT_DIRECTORY to <current binary dir>/wheels. Needs a Python 3
# interpreter (Python3_EXECUTABLE, else found), no torch; the work is done by
# max_device_plugin_wheel.py next to this file.
set(MAXDEV_PLUGIN_WHEEL_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/max_device_plugin_wheel.py" CACHE INTERNAL
    "max_device_plugin_wheel.py of the MaxDevicePlugin package")

function(max_device_add_plugin_wheel target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "NAME;VERSION;PACKAGE;OUTPUT_DIRECTORY" "")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR
      "max_device_add_plugin_wheel(${target}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "max_device_add_plugin_wheel(${target}): no target ${target} "
                        "(create it with max_device_add_plugin first)")
  endif()
  if(NOT arg_VERSION)
    message(FATAL_ERROR "max_device_add_plugin_wheel(${target}): VERSION is required")
  endif()
  if(NOT arg_NAME)
    set(arg_NAME ${target})
  endif()
  if(NOT arg_OUTPUT_DIRECTORY)
    set(arg_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/wheels")
  endif()
  set(package_args "")
  if(arg_PACKAGE)
    set(package_args --package ${arg_PACKAGE})
  endif()
  if(NOT Python3_EXECUTABLE)
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
  endif()
  set(stamp "${CMAKE_CURRENT_BINARY_DIR}/${target}.wheel.stamp")
  add_custom_command(OUTPUT "${stamp}"
    COMMAND "${Python3_EXECUTABLE}" "${MAXDEV_PLUGIN_WHEEL_SCRIPT}" "$<TARGET_FILE:${target}>"
            --name ${arg_NAME} --version ${arg_VERSION} --out-dir "${arg_OUTPUT_DIRECTORY}" ${package_args}
    COMMAND "${CMAKE_COMMAND}" -E touch "${stamp}"
    DEPENDS ${target} "${MAXDEV_PLUGIN_WHEEL_SCRIPT}"
    COMMENT "Packaging plugin ${target} as a Python wheel in ${arg_OUTPUT_DIRECTORY}"
    VERBATIM)
  add_custom_target(${target}_wheel ALL DEPENDS "${stamp}")
endfunction()
