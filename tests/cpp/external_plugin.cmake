# ctest script: install the plugin SDK (component plugin_api) into a fresh
# prefix, copy the external plugin project out of this tree, and build it
# with nothing but that prefix. Inputs: BUILD_DIR, SOURCE_DIR, WORK_DIR, and
# EXPECT, a file the build must produce (default libhello.so).
if(NOT EXPECT)
  set(EXPECT libhello.so)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --component plugin_api
                        --prefix "${WORK_DIR}/prefix" COMMAND_ERROR_IS_FATAL ANY)
file(COPY "${SOURCE_DIR}/" DESTINATION "${WORK_DIR}/src")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${WORK_DIR}/src" -B "${WORK_DIR}/build"
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" COMMAND_ERROR_IS_FATAL ANY)
if(NOT EXISTS "${WORK_DIR}/build/${EXPECT}")
  message(FATAL_ERROR "the external plugin project did not produce ${EXPECT}")
endif()
