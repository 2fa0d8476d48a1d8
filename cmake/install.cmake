# Installs what an embedding project needs (README, "Embedding"):
#   include/epmoe/...                    the public headers
#   lib/libepmoe_*.a                     the layers' static libraries
#   lib/cmake/epmoe/epmoeConfig.cmake    find_package(epmoe) -> epmoe::epmoe
#   bin/epmoe                            the command-line tool
# epmoe::epmoe is the api layer's library; it brings the layers below it and
# their dependencies (oneDNN, OpenMP, MPI when built), which the package
# config finds again on the consumer's side. With MPI, the config sets
# epmoe_WITH_MPI and <epmoe/mpi_communicator.h> is installed.
include(CMakePackageConfigHelpers)

set(epmoe_installed_targets epmoe_flags epmoe_core epmoe_hardware epmoe_kernels epmoe_transport epmoe_comm epmoe_balance
                            epmoe_ep epmoe_moe epmoe_data epmoe_plan epmoe_run_config epmoe_run_reports epmoe_run epmoe_api)
set(EPMOE_INSTALLED_WITH_MPI OFF)
if(TARGET epmoe_transport_mpi)
  list(APPEND epmoe_installed_targets epmoe_transport_mpi)
  set(EPMOE_INSTALLED_WITH_MPI ON)
endif()
set_target_properties(epmoe_api PROPERTIES EXPORT_NAME epmoe)

install(TARGETS ${epmoe_installed_targets} EXPORT epmoeTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(EPMOE_INSTALLED_WITH_MPI)
  install(DIRECTORY include/epmoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
else()  # <epmoe/mpi_communicator.h> has nothing behind it
  install(DIRECTORY include/epmoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN mpi_communicator.h EXCLUDE)
endif()
if(TARGET epmoe)
  install(TARGETS epmoe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(epmoe_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/epmoe)
install(EXPORT epmoeTargets NAMESPACE epmoe:: DESTINATION ${epmoe_config_dir})
configure_package_config_file(cmake/epmoeConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/epmoeConfig.cmake
                              INSTALL_DESTINATION ${epmoe_config_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/epmoeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/epmoeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/epmoeConfigVersion.cmake
        DESTINATION ${epmoe_config_dir})
