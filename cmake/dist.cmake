# dist area: OpenMPI for the multi-process Comm (src/dist/mpi_comm.cpp). The library always links MPI;
# whether MPI is used is decided at run time (dist::make_comm: OMPI_COMM_WORLD_SIZE set => MPI).
find_package(MPI REQUIRED COMPONENTS CXX)
target_link_libraries(olmosft_lib PUBLIC MPI::MPI_CXX)
