# `cmake --install` puts headers under include/ember/<module>/, the module libraries and the
# umbrella target in lib/, and EmberConfig.cmake so that other projects can
#   find_package(Ember CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE Ember::ember)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(EMBER_EXPORTED_TARGETS ember)
foreach(module tensor autograd nn optim data dist)
  if(TARGET ember_${module})
    set_target_properties(ember_${module} PROPERTIES EXPORT_NAME ${module})
    list(APPEND EMBER_EXPORTED_TARGETS ember_${module})
    # Public headers only: the CPU/CUDA kernels and detail/ stay private.
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${module}/
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember/${module}
            FILES_MATCHING PATTERN "*.h"
            PATTERN "cpu" EXCLUDE PATTERN "cuda" EXCLUDE PATTERN "detail" EXCLUDE)
  endif()
endforeach()

install(TARGETS ${EMBER_EXPORTED_TARGETS} EXPORT EmberTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${EMBER_INCLUDE_DIR}/ember/config.h ${EMBER_INCLUDE_DIR}/ember/ember.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember)
install(EXPORT EmberTargets NAMESPACE Ember:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/EmberConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/EmberConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/EmberConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/EmberConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/EmberConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)
