# cmake -DHEADER=<flashcore.h> -P check_documented.cmake
#
# What flashcore.h must say because the library cannot tell it at run time
# (issue 59's audit item 6): a 0.2 caller's sizeof(flashcore_forward_params)
# (192, padding after head_dim_v included) is where 0.3's num_splits ends, so
# that caller's padding is read as num_splits unless the struct was zeroed.
file(READ "${HEADER}" text)
string(REGEX REPLACE "\n \\* ?" " " text "${text}")  # the comment's lines joined
foreach(needed "A 0.2 caller must zero its struct before setting" "reads as num_splits = 0")
  string(FIND "${text}" "${needed}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${HEADER} no longer says \"${needed}\" (the 0.2/0.3 struct_size note, ABI policy)")
  endif()
endforeach()
