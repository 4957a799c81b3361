# java_installed_jar: `cmake --install` into PREFIX, then InstalledJar.java
# with the installed jar alone on its class path, LD_LIBRARY_PATH unset and
# no -Dbufpool.library: the jar must find the installed library by itself;
# and again after the whole prefix is moved (the relative path).
foreach(v BUILD_DIR PREFIX DATADIR JAVA PROGRAM)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "installed_jar_test: pass -D${v}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${PREFIX} ${PREFIX}-moved)
if(SHARED)
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
    OUTPUT_QUIET RESULT_VARIABLE rc)
else()
  execute_process(COMMAND ${CMAKE_COMMAND} -DCMAKE_INSTALL_PREFIX=${PREFIX}
    -P ${JAVA_INSTALL_SCRIPT} OUTPUT_QUIET RESULT_VARIABLE rc)
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installed_jar_test: the install failed (${rc})")
endif()
foreach(root ${PREFIX} ${PREFIX}-moved)
  if(root STREQUAL "${PREFIX}-moved")
    file(RENAME ${PREFIX} ${root})
  endif()
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
            ${JAVA} --enable-native-access=ALL-UNNAMED
            -cp ${root}/${DATADIR}/java/bufpool.jar ${PROGRAM} ${root}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "loaded ${root}/")
    message(FATAL_ERROR "installed_jar_test: from ${root}: rc ${rc}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endforeach()
file(REMOVE_RECURSE ${PREFIX}-moved)
