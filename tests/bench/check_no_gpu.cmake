# Runs TOOL with every GPU hidden and checks that it exits 2 with a message
# naming the reason. "-1" hides every device: CUDA stops at the first invalid
# index. (An empty value would not do: set(ENV{...} "") unsets the variable.)
set(ENV{CUDA_VISIBLE_DEVICES} "-1")
execute_process(COMMAND ${TOOL} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
if(NOT status STREQUAL "2")
  message(FATAL_ERROR "${TOOL} exited with '${status}', expected 2 (no usable GPU)\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT err MATCHES "no usable GPU")
  message(FATAL_ERROR "${TOOL} gave no reason on stderr; got: '${err}'")
endif()
message(STATUS "${TOOL} refused: ${err}")
