# readme_block(TEXT LANG OUT): the body of the first ```LANG fenced block in
# TEXT (without its fences) in OUT; fails the script when there is none or
# it does not end. The README tests pass README.md, or one section of it.
function(readme_block text lang out)
  set(fence "```${lang}\n")
  string(FIND "${text}" "${fence}" begin)
  if(begin LESS 0)
    message(FATAL_ERROR "README.md has no ```${lang} block where expected")
  endif()
  string(LENGTH "${fence}" fence_len)
  math(EXPR begin "${begin} + ${fence_len}")
  string(SUBSTRING "${text}" ${begin} -1 rest)
  string(FIND "${rest}" "```" end)
  if(end LESS 0)
    message(FATAL_ERROR "README.md's ```${lang} block does not end")
  endif()
  string(SUBSTRING "${rest}" 0 ${end} body)
  set(${out} "${body}" PARENT_SCOPE)
endfunction()
