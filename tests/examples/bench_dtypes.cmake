# hvd_bench's own per-element check over dtypes and ops, engine and raw, at 3 ranks.
foreach(mode "" "--raw")
  foreach(spec "float16 sum" "bfloat16 max" "int8 min" "uint8 sum" "int64 product" "float64 average" "bool max")
    separate_arguments(spec)
    list(GET spec 0 dtype)
    list(GET spec 1 op)
    execute_process(COMMAND ${HVDRUN} --no-prefix -np 3 ${BENCH} ${mode} -d ${dtype} -o ${op}
                            -b 1 -e 64K -f 16 -n 3 -w 1
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${dtype} ${op} ${mode}: exit ${rc}\n${out}\n${err}")
    endif()
    message(STATUS "${dtype} ${op} ${mode}: ok")
  endforeach()
endforeach()
