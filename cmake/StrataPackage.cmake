# `cmake --install`: libstrata with its public headers and a CMake package (find_package(Strata
# CONFIG) gives Strata::strata), stratad and stratactl. The build tree exports the same targets,
# so a project can also build against an uninstalled tree.
include(CMakePackageConfigHelpers)

set(STRATA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
install(TARGETS strata EXPORT StrataTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS stratad stratactl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT StrataTargets NAMESPACE Strata:: DESTINATION ${STRATA_CMAKE_DIR})
export(EXPORT StrataTargets NAMESPACE Strata:: FILE ${PROJECT_BINARY_DIR}/StrataTargets.cmake)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/StrataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/StrataConfig.cmake INSTALL_DESTINATION ${STRATA_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/StrataConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/StrataConfig.cmake ${PROJECT_BINARY_DIR}/StrataConfigVersion.cmake
  DESTINATION ${STRATA_CMAKE_DIR})
