# Runs COMMAND (a list) with a time limit and checks its exit code and combined output.
#
#   cmake -DCOMMAND="prog;arg;..." [-DEXPECT_NONZERO=ON | -DEXPECT_CODE=n] [-DEXPECT=regex]
#         [-DEXPECT_COUNT="regex;count"] [-DREJECT=regex] -DTIMEOUT=sec -P expect_output.cmake
#
# EXPECT must match the output; EXPECT_COUNT's regex must match exactly `count` times; REJECT
# must not match. With EXPECT_NONZERO the command must fail (and not by the time limit).
if(NOT TIMEOUT)
  set(TIMEOUT 60)
endif()
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT ${TIMEOUT})
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("---- output of the command (exit: ${rc}, ${took} s) ----\n${out}----")

set(failed "")
if(DEFINED EXPECT_CODE)
  if(NOT rc STREQUAL "${EXPECT_CODE}")
    string(APPEND failed "expected exit code ${EXPECT_CODE}, got ${rc}\n")
  endif()
elseif(EXPECT_NONZERO)
  if(rc STREQUAL "0")
    string(APPEND failed "expected a non-zero exit code, got 0\n")
  elseif(NOT rc MATCHES "^[0-9]+$")
    string(APPEND failed "the command did not exit normally: ${rc}\n")
  endif()
elseif(NOT rc STREQUAL "0")
  string(APPEND failed "expected exit code 0, got ${rc}\n")
endif()
if(DEFINED EXPECT AND NOT out MATCHES "${EXPECT}")
  string(APPEND failed "the output does not match '${EXPECT}'\n")
endif()
if(DEFINED EXPECT_COUNT)
  list(GET EXPECT_COUNT 0 regex)
  list(GET EXPECT_COUNT 1 want)
  string(REGEX MATCHALL "${regex}" hits "${out}")
  list(LENGTH hits got)
  if(NOT got EQUAL want)
    string(APPEND failed "'${regex}' matched ${got} times, expected ${want}\n")
  endif()
endif()
if(DEFINED REJECT AND out MATCHES "${REJECT}")
  string(APPEND failed "the output matches '${REJECT}'\n")
endif()
if(failed)
  message(FATAL_ERROR "${failed}")
endif()
