# cmake -DPROGRAM=<example> -P run_example.cmake
#
# Runs one of the C examples. It passes when the program succeeds, or when
# it fails at its first step, flashcore_create, with NO_DEVICE (a machine
# without an NVIDIA GPU or driver), saying so on its first line.
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\nstdout: ${out}\nstderr: ${err}")
if(rc EQUAL 0)
  return()
endif()
if(NOT err MATCHES "^flashcore_create: no CUDA device or driver: ")
  message(FATAL_ERROR "the example failed, and not at flashcore_create for want of a device")
endif()
message(STATUS "no device: the example stopped at flashcore_create, naming the reason")
