# Compressed pulls are tested through the parameter server's store and a
# whole job: those tests need the layers above compress.
target_link_libraries(compressed_pull_store_test PRIVATE pushpull_ps)
target_link_libraries(compressed_pull_test PRIVATE pushpull_kvstore)
