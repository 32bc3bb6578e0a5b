# The backward family (kernels/bwd/): included by kernels/CMakeLists.txt at its
# first line in kernels/kernels.list.

flashcore_read_tiles(bwd ${CMAKE_CURRENT_LIST_DIR}/tiles.def FLASHCORE_BWD_TILE)

# The backward family's rules over its selected kernels, records
# "path|in|kv|out|head_dim|head_dim_v|tile":
# - its kernels take and write 16-bit types, the gradients in the input's
#   type (the dQ accumulator is fp32 in the workspace, not an output type);
# - its sm90 (hopper) kernels have one head dim of 64, 96, 128 or 256, or
#   (192, 128) (bwd/sm90/config.cuh).
function(flashcore_bwd_check_kernels kernels)
  foreach(kernel IN LISTS kernels)
    string(REPLACE "|" ";" f "${kernel}")
    list(GET f 0 path)
    list(GET f 1 in)
    list(GET f 2 kv)
    list(GET f 3 out)
    list(GET f 4 head_dim)
    list(GET f 5 head_dim_v)
    if(path STREQUAL "sm90" AND NOT "${head_dim}/${head_dim_v}" MATCHES "^(64/64|96/96|128/128|256/256|192/128)$")
      message(FATAL_ERROR "kernels.list: bwd sm90 ${head_dim} ${head_dim_v}: the sm90 backward has head dims 64, 96, 128, 256 and (192, 128)")
    endif()
    if(NOT in STREQUAL out OR NOT in STREQUAL kv OR NOT in MATCHES "^(fp16|bf16)$")
      message(FATAL_ERROR "kernels.list: bwd ${path} ${in} -> ${out}: the backward kernels write their 16-bit input type")
    endif()
  endforeach()
endfunction()
