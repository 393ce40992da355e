# `cmake --install` puts headers under include/ember/<module>/ (apps: the Trainer's), the
# versioned module libraries and the umbrella target in lib/, EmberConfig.cmake so that other
# projects can
#   find_package(Ember CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE Ember::ember)
# and ember.pc for builds without CMake:
#   g++ app.cpp $(pkg-config --cflags --libs ember)
# Two install components, one Debian package each (cmake/EmberPackaging.cmake):
#   runtime  the shared libraries (libember_X.so.MAJOR*) and ember-train
#   dev      headers, the libember_X.so links, CMake package files and ember.pc
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(EMBER_EXPORTED_TARGETS ember)
set(EMBER_PC_LIBS "")
foreach(module tensor autograd nn optim data dist)
  if(TARGET ember_${module})
    set_target_properties(ember_${module} PROPERTIES EXPORT_NAME ${module})
    list(APPEND EMBER_EXPORTED_TARGETS ember_${module})
    # Linked in reverse dependency order: dist first, tensor last.
    set(EMBER_PC_LIBS "-lember_${module} ${EMBER_PC_LIBS}")
    # Public headers only: the CPU/CUDA kernels and detail/ stay private.
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${module}/
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember/${module}
            COMPONENT dev
            FILES_MATCHING PATTERN "*.h"
            PATTERN "cpu" EXCLUDE PATTERN "cuda" EXCLUDE PATTERN "detail" EXCLUDE)
  endif()
endforeach()

# apps: the Trainer library, with only the headers its target lists (EMBER_PUBLIC_HEADERS);
# ember-train's own parts stay private. Linked before dist.
if(TARGET ember_apps)
  set_target_properties(ember_apps PROPERTIES EXPORT_NAME apps)
  list(APPEND EMBER_EXPORTED_TARGETS ember_apps)
  set(EMBER_PC_LIBS "-lember_apps ${EMBER_PC_LIBS}")
  get_target_property(EMBER_APPS_HEADERS ember_apps EMBER_PUBLIC_HEADERS)
  install(FILES ${EMBER_APPS_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember/apps
          COMPONENT dev)
endif()

install(TARGETS ${EMBER_EXPORTED_TARGETS} EXPORT EmberTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${EMBER_INCLUDE_DIR}/ember/config.h ${EMBER_INCLUDE_DIR}/ember/ember.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember COMPONENT dev)
install(EXPORT EmberTargets NAMESPACE Ember:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember
        COMPONENT dev)

# What EmberConfig.cmake has to find for the exported targets' link interfaces.
set(EMBER_CONFIG_WITH_DIST OFF)
if(TARGET ember_dist)
  set(EMBER_CONFIG_WITH_DIST ON)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/EmberConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/EmberConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)
# The compatibility rule: find_package(Ember X.Y) accepts an installed X.Z with Z >= Y, never
# another major version. The libraries' SONAME carries the major version too
# (libember_tensor.so.X), and the major version goes up with every change that breaks source
# or binary compatibility, also before 1.0.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/EmberConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/EmberConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/EmberConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember COMPONENT dev)

# ember.pc finds the prefix from where it lies (${pcfiledir}), so the same file serves
# `cmake --install --prefix ANYWHERE` and the Debian package's /usr.
file(RELATIVE_PATH EMBER_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" EMBER_PC_TO_PREFIX "${EMBER_PC_TO_PREFIX}")
set(EMBER_PC_REQUIRES "")
if(EMBER_CONFIG_WITH_DIST)
  # ember_dist links MPI publicly, as Ember::dist does.
  set(EMBER_PC_REQUIRES "mpi-cxx")
endif()
string(STRIP "${EMBER_PC_LIBS}" EMBER_PC_LIBS)
configure_file(${CMAKE_CURRENT_LIST_DIR}/ember.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ember.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ember.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
