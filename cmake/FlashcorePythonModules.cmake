# The compiled modules of the Python package (flashcore._fastcall,
# flashcore.jax's handlers): where the package finds them.
#
# flashcore_python_module(TARGET) puts TARGET's module beside libflashcore
# in the build tree, where the package looks next to the library it loaded
# (FLASHCORE_LIBRARY), and has the wheel (scikit-build-core sets SKBUILD)
# install it into the package.
function(flashcore_python_module target)
  get_target_property(_library_dir flashcore BINARY_DIR)
  set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${_library_dir})
  if(SKBUILD)
    install(TARGETS ${target} LIBRARY DESTINATION flashcore COMPONENT Python)
  endif()
endfunction()
