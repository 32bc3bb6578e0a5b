# The forward family (kernels/fwd/): included by kernels/CMakeLists.txt at its
# first line in kernels/kernels.list.

# Its tile names (the list's tile column) from the one source C++ reads too.
flashcore_read_tiles(fwd ${CMAKE_CURRENT_LIST_DIR}/tiles.def FLASHCORE_FWD_TILE)

# The forward family's rules over its selected kernels, records
# "path|in|out|head_dim|head_dim_v|tile":
# - its kernels write their input type (the fp8 kernels, when they come,
#   will be lines whose output is a 16-bit type);
# - a 16-bit sm90 kernel needs an sm80 kernel of the same dtype and head
#   dims: the portable kernel serves what the sm_90a one cannot (small
#   grids, other GPUs), and flashcore_supported_head_dims lists the sm80
#   head dims. A one-byte input type has no portable kernel and needs none.
function(flashcore_fwd_check_kernels kernels)
  set(sm80_kernels)
  foreach(kernel IN LISTS kernels)
    string(REPLACE "|" ";" f "${kernel}")
    list(GET f 0 path)
    list(GET f 1 in)
    list(GET f 2 out)
    list(GET f 3 head_dim)
    list(GET f 4 head_dim_v)
    if(NOT in STREQUAL out)
      message(FATAL_ERROR "kernels.list: fwd ${path} ${in} -> ${out}: the forward kernels write their input type")
    endif()
    if(path STREQUAL "sm80")
      list(APPEND sm80_kernels "${in}/${head_dim}/${head_dim_v}")
    endif()
  endforeach()
  foreach(kernel IN LISTS kernels)
    string(REPLACE "|" ";" f "${kernel}")
    list(GET f 0 path)
    list(GET f 1 in)
    list(GET f 3 head_dim)
    list(GET f 4 head_dim_v)
    if(path STREQUAL "sm90" AND in MATCHES "^(fp16|bf16)$" AND NOT "${in}/${head_dim}/${head_dim_v}" IN_LIST sm80_kernels)
      message(FATAL_ERROR "kernels.list: fwd sm90 ${in} ${head_dim} ${head_dim_v} has no sm80 line with the same "
                          "dtype and head dims")
    endif()
  endforeach()
endfunction()
