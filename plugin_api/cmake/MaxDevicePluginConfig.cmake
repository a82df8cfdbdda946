# Package config for find_package(MaxDevicePlugin): the imported target
# max_device::plugin_api (headers plugin.h and plugin.hpp) and the function
# max_device_add_plugin (MaxDevicePlugin.cmake, the same file the max_device
# build itself uses).
include("${CMAKE_CURRENT_LIST_DIR}/MaxDevicePluginTargets.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/MaxDevicePlugin.cmake")
