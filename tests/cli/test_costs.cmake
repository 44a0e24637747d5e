# Costs of this folder's longest tests for ctest's scheduling (tests/cli/CMakeLists.txt):
# about their seconds on 2 cores.
set_tests_properties(RealModel.ShortGrpoJobRaisesAccuracyOnTheEasiestProblemsAndExports
                     PROPERTIES COST 180)
set_tests_properties(RealModel.ItsDirectoryItsNameAndItsHubNameAreTheSameFiles PROPERTIES COST 30)
