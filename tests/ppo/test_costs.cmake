# Costs of this folder's longest tests for ctest's scheduling (tests/cli/CMakeLists.txt says
# why): about their seconds on 2 cores.
set_tests_properties(MultiTurnJob.SftOnToolTracesThenGrpoWithTheCalculator PROPERTIES COST 60)
set_tests_properties(PpoJob.LearnsWithShardedScorersAndATensorParallelRollout PROPERTIES COST 35)
set_tests_properties(MultiTurnJob.GuessTheNumberLearnsOverTheGamesTurns PROPERTIES COST 26)
set_tests_properties(PpoJob.GrpoOnATinyMixtureOfExpertsLearnsAndItsExportLoadsInTransformers PROPERTIES COST 30)
set_tests_properties(PpoJob.MixtureOfExpertsTrainsWithZero3OverTwoRanksAsPlanned PROPERTIES COST 15)
