# cmake --install the build into a scratch prefix, configure and build examples/find_package
# against it with find_package(hvd), and run the result alone and under the installed hvdrun.
file(REMOVE_RECURSE "${WORK}")
function(run what)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                  TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
endfunction()
run("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK}/prefix")
run("configure" ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/build"
    "-DCMAKE_PREFIX_PATH=${WORK}/prefix")
run("build" ${CMAKE_COMMAND} --build "${WORK}/build")
file(GLOB exe "${WORK}/build/hvd_consumer*")
if(NOT exe)
  message(FATAL_ERROR "no consumer program was built in ${WORK}/build")
endif()
run("run" ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${WORK}/prefix/lib" ${exe})
message(STATUS "${last_out}")
if(NOT last_out MATCHES "ok, ranks=1")
  message(FATAL_ERROR "unexpected output: ${last_out}")
endif()
run("run under hvdrun" ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${WORK}/prefix/lib"
    "${WORK}/prefix/bin/hvdrun" --no-prefix -np 2 ${exe})
if(NOT last_out MATCHES "ok, ranks=2")
  message(FATAL_ERROR "unexpected output under hvdrun: ${last_out}")
endif()
# The C API's consumer, without LD_LIBRARY_PATH: the installed libhvd_c finds libhvd itself.
run("run the C consumer" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
    "${WORK}/build/hvd_c_consumer")
if(NOT last_out MATCHES "hvd_c_consumer: ok, ranks=1")
  message(FATAL_ERROR "unexpected output of the C consumer: ${last_out}")
endif()
run("run the C consumer under hvdrun" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
    "${WORK}/prefix/bin/hvdrun" --no-prefix -np 2 "${WORK}/build/hvd_c_consumer")
if(NOT last_out MATCHES "hvd_c_consumer: ok, ranks=2")
  message(FATAL_ERROR "unexpected output of the C consumer under hvdrun: ${last_out}")
endif()
# The installed libhvd finds what it links from outside the system's directories (CUDA's, Open
# MPI's) by its own RUNPATH, not by the loader's cache (which names CUDA only on some machines).
file(GLOB loader /lib64/ld-linux-*.so.2)
file(GLOB installed_lib "${WORK}/prefix/lib/libhvd.so.*.*")
if(loader AND installed_lib)
  list(GET loader 0 loader)
  list(GET installed_lib 0 installed_lib)
  run("list the installed libhvd's libraries" ${loader} --inhibit-cache --list ${installed_lib})
  if(last_out MATCHES "not found")
    message(FATAL_ERROR "the installed libhvd does not find its libraries without the loader's "
                        "cache (its RUNPATH lacks their directories):\n${last_out}")
  endif()
endif()
